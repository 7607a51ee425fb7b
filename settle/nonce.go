package settle

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// A signer key's nonces, handled as txmgr handles them: loaded lazily from the chain and the
// ledger, taken only by rows the ledger committed, and reset (loaded afresh before the next
// use) whenever an error leaves the next nonce in doubt. Everything here runs under the
// sender's mu: it is the key's only nonce allocator (ARCHITECTURE.md invariant 7).

// nonces is one key's nonce stream.
type nonces struct {
	next   uint64 // the nonce the next committed row takes
	loaded bool   // next is known; false: load before the next commit
	mined  uint64 // the chain's mined nonce of the key at the last load
	// shown is next+1 while loaded, 0 while not: what operators see (SignerHealth.NextNonce),
	// read without mu, so that a look never waits behind a commit.
	shown atomic.Uint64
}

// reset makes the next commit load the nonce afresh.
func (n *nonces) reset() { n.loaded = false; n.shown.Store(0) }

// take moves past k nonces that committed rows now hold.
func (n *nonces) take(k int) { n.next += uint64(k); n.shown.Store(n.next + 1) }

// set records a load's result.
func (n *nonces) set(next, mined uint64) {
	n.next, n.loaded, n.mined = next, true, mined
	n.shown.Store(next + 1)
}

// nextShown is the key's next nonce as last published; ok is false until it is loaded.
func (n *nonces) nextShown() (next uint64, ok bool) {
	v := n.shown.Load()
	return v - 1, v != 0
}

// lowestFree is the lowest nonce from latest (the chain's mined nonce) on that no settlement
// holds; held is ascending. It is past the ledger's highest normally, or a gap below it (a
// foreign transaction that held it was reorganised away).
func lowestFree(latest uint64, held []uint64) uint64 {
	next := latest
	for _, n := range held {
		if n == next {
			next++
		} else if n > next {
			break
		}
	}
	return next
}

// load derives the next nonce from the chain's mined nonce and the ledger: every transaction of
// ours, mined, pooled or not sent yet (a crash between commit and broadcast), is in the ledger
// before it leaves the process, so the ledger's highest nonce covers them. The chain's pending
// nonce is not used: past ours it counts only transactions that are not ours, sitting in a pool,
// and one of those that a pool drops would leave the nonce it held a gap nobody fills, holding
// back every later transaction of the key. Signing at such a nonce instead costs at most a
// replacement fight or a re-sign (foreign.go). Caller holds mu.
func (s *sender) load(ctx context.Context) error {
	e := s.net.engine
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RPCTimeout)
	defer cancel()
	// The count comes with the answering node's head: a node behind a head we were told of may
	// not count a transaction of the key mined since, and signing at its nonce would only earn a
	// "nonce too low". Asked again, then not known.
	var latest, head hexutil.Uint64
	for try := 1; ; try++ {
		b := []rpc.BatchElem{
			ethrpc.TransactionCount(s.addr, "latest", &latest),
			ethrpc.BlockNumber(&head),
		}
		err := s.net.chain.BatchCallContext(ctx, b)
		if err == nil {
			err = errors.Join(b[0].Error, b[1].Error)
		}
		if err == nil && uint64(head) < s.net.maxSeen.Load() {
			err = fmt.Errorf("the node answering is behind the chain's head (block %d, %d seen)", uint64(head), s.net.maxSeen.Load())
		}
		if err == nil {
			s.net.saw(uint64(head))
			break
		}
		if try == 3 {
			return facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "could not read the signer's nonce; nothing was sent, retry", err)
		}
	}
	// The lowest nonce from the chain's on that no settlement holds: past the ledger's highest
	// normally, or a gap below it (a foreign transaction that held it was reorganised away).
	held, err := e.store.NoncesHeld(ctx, s.net.net.ID, s.addr, uint64(latest))
	if err != nil {
		return ledgerDown(err)
	}
	next := lowestFree(uint64(latest), held)
	if s.nonces.loaded && next != s.next {
		e.log.Warn("signer nonce resynchronised", "network", s.net.net.ID, "signer", s.addr, "was", s.next, "now", next)
		e.cfg.Observer.NonceGap(s.net.net.ID, s.addr.Hex(), NonceResync)
	}
	s.nonces.set(next, uint64(latest))
	return nil
}

// nextNonce is the nonce the key's next row would take.
func (s *sender) nextNonce() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// reload reads the key's next nonce again from the chain and the ledger: it is stale once a
// foreign transaction used one. Caller holds s.mu.
func (s *sender) reload(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.net.engine.cfg.RPCTimeout)
	defer cancel()
	if err := s.load(lctx); err != nil {
		s.nonces.reset()
		return err
	}
	return nil
}
