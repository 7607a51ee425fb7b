package settle

import (
	"context"
	"math/big"
	"sort"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// SignerHealth is one signer key as this process sees it, for metrics and operators.
type SignerHealth struct {
	Network string
	Address common.Address
	// InFlight is the key's transactions in flight (signed, not yet mined or failed) in this process.
	InFlight int
	// Balance is the key's native balance at the last read; nil until it was read once.
	Balance *big.Int
	// BalanceReadAt is when Balance was read (zero until then): a reading that stops moving is
	// stale, whatever it says.
	BalanceReadAt time.Time
	// BalanceLow: the balance is below Config.SignerMinBalance, so the key takes no new settlement.
	BalanceLow bool
	// Leased: this process holds the key (always, without a Leaser). A key held elsewhere has no
	// in-flight count here, and its balance is not read.
	Leased bool
	// NextNonce is the transaction nonce the key's next settlement takes; nil until the key's
	// nonce stream has loaded it (at its first settlement, and again after anything that left it
	// in doubt).
	NextNonce *uint64
	// Retiring: the key takes no new settlement and works what it has open to the end
	// (NetworkConfig.Retiring). Open is how many settlements of the key this process still works
	// (signed, broadcast, or mined and not yet final): a retiring key whose holder has none open is
	// drained, and can be removed. Zero where this process does not hold the key.
	Retiring bool
	Open     int
}

// Signers lists every configured signer key of every network, by network then in configured order.
func (e *Engine) Signers() []SignerHealth {
	ids := make([]string, 0, len(e.networks))
	for id := range e.networks {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	open := e.openBySender()
	var out []SignerHealth
	for _, id := range ids {
		for _, s := range e.networks[id].senders {
			st := SignerHealth{Network: id, Address: s.addr, InFlight: int(s.inFlight.Load()), BalanceLow: s.low.Load(),
				Leased: s.held() != nil, Retiring: s.retiring, Open: open[s]}
			if b := s.balance.Load(); b != nil {
				st.Balance = new(big.Int).Set(b)
			}
			if at := s.balanceAt.Load(); at != 0 {
				st.BalanceReadAt = time.Unix(0, at)
			}
			if next, ok := s.nextShown(); ok {
				st.NextNonce = &next
			}
			out = append(out, st)
		}
	}
	return out
}

// balanceLoop reads the network's signer balances every BalanceInterval.
func (n *chainEngine) balanceLoop(ctx context.Context) {
	t := time.NewTicker(n.engine.cfg.BalanceInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.readBalances(ctx)
		}
		n.beat(LoopBalance)
	}
}

// readBalances reads the native balance of every key this process holds on the network, in one
// batch, and moves each key in or out of the low state. A key below the minimum takes no new
// settlement (pickSender skips it); what it has in flight carries on, fee bumps included, since
// abandoning a signed transaction would strand its nonce. A failed read keeps the last state.
func (n *chainEngine) readBalances(ctx context.Context) {
	e := n.engine
	var senders []*sender
	var elems []rpc.BatchElem
	for _, s := range n.senders {
		if s.held() == nil {
			continue
		}
		senders = append(senders, s)
		elems = append(elems, ethrpc.Balance(s.addr, "latest", new(hexutil.Big)))
	}
	if len(elems) == 0 {
		return
	}
	if err := n.batch(ctx, elems); err != nil {
		if ctx.Err() == nil {
			e.log.Warn("reading signer balances", "network", n.net.ID, "err", err)
		}
		return
	}
	threshold := e.cfg.SignerMinBalance
	for i, s := range senders {
		if elems[i].Error != nil {
			e.log.Warn("reading a signer balance", "network", n.net.ID, "signer", s.addr, "err", elems[i].Error)
			continue
		}
		bal := new(big.Int).Set((*big.Int)(elems[i].Result.(*hexutil.Big)))
		s.balance.Store(bal)
		s.balanceAt.Store(e.now().UnixNano())
		low := threshold != nil && threshold.Sign() > 0 && bal.Cmp(threshold) < 0
		switch was := s.low.Swap(low); {
		case low && !was:
			e.log.Error("signer balance below threshold: fund it; the signer takes no new settlements until then",
				"network", n.net.ID, "signer", s.addr, "balance_wei", bal, "threshold_wei", threshold)
		case !low && was:
			e.log.Info("signer balance back above threshold; the signer takes settlements again",
				"network", n.net.ID, "signer", s.addr, "balance_wei", bal, "threshold_wei", threshold)
		}
	}
}

// allLow reports whether every key this process holds on the network that is not retiring is below
// its minimum balance.
func (n *chainEngine) allLow() bool {
	held := 0
	for _, s := range n.senders {
		if s.held() == nil || s.retiring {
			continue
		}
		held++
		if !s.low.Load() {
			return false
		}
	}
	return held > 0
}
