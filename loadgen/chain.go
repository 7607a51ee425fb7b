package loadgen

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// node is the chain's JSON-RPC endpoint with a bound on each call.
type node struct {
	c       *rpc.Client
	timeout time.Duration
}

func (n *node) call(ctx context.Context, out any, method string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	if err := n.c.CallContext(ctx, out, method, args...); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

func (n *node) batch(ctx context.Context, b []rpc.BatchElem) error {
	ctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	return n.c.BatchCallContext(ctx, b)
}

func (n *node) uint(ctx context.Context, method string, args ...any) (uint64, error) {
	var v hexutil.Uint64
	err := n.call(ctx, &v, method, args...)
	return uint64(v), err
}

func (n *node) head(ctx context.Context) (uint64, error) { return n.uint(ctx, "eth_blockNumber") }

func (n *node) nonceAt(ctx context.Context, a common.Address, tag string) (uint64, error) {
	return n.uint(ctx, "eth_getTransactionCount", a, tag)
}

// callString runs a string-returning view (name(), version()) on the latest block.
func (n *node) callString(ctx context.Context, to common.Address, sig string) (string, error) {
	var out hexutil.Bytes
	if err := n.call(ctx, &out, "eth_call", map[string]any{"to": to, "data": hexutil.Bytes(crypto.Keccak256([]byte(sig))[:4])}, "latest"); err != nil {
		return "", err
	}
	strT, _ := abi.NewType("string", "", nil)
	vals, err := abi.Arguments{{Type: strT}}.Unpack(out)
	if err != nil || len(vals) != 1 {
		return "", fmt.Errorf("%s on %s: not a string (%d bytes of code there?): %v", sig, to, len(out), err)
	}
	return vals[0].(string), nil
}

// receiptStatus polls for a transaction's receipt until it is mined or ctx ends.
func (n *node) receiptStatus(ctx context.Context, tx common.Hash, every time.Duration) (uint64, error) {
	for {
		var r *struct {
			Status hexutil.Uint64 `json:"status"`
		}
		if err := n.call(ctx, &r, "eth_getTransactionReceipt", tx); err != nil {
			return 0, err
		}
		if r != nil {
			return uint64(r.Status), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no receipt for %s: %w", tx, ctx.Err())
		case <-time.After(every):
		}
	}
}

// ChainCount is what the chain says happened to a phase's payments.
type ChainCount struct {
	Blocks             uint64 // blocks mined during the phase
	Transfers          int    // payments whose payee received at least one transfer
	AuthorizationsUsed int    // payments whose authorization is used on chain
	// Duplicates counts payments paid more than once: a payee with several transfers, or an
	// authorization used more than once (USDC forbids the latter; it is counted anyway).
	Duplicates int
	// SenderTxs and SenderReverted are the transactions the phase's senders (the facilitator's
	// signers) got mined, and how many of them reverted: gas paid for nothing.
	SenderTxs, SenderReverted int
	// SenderGas is the gas the senders' mined transactions used (reverted ones too), from the
	// receipts' gasUsed.
	SenderGas uint64
}

// GasPerTransfer is the senders' gas per payment that arrived on chain; 0 if none did.
func (c ChainCount) GasPerTransfer() float64 {
	if c.Transfers == 0 {
		return 0
	}
	return float64(c.SenderGas) / float64(c.Transfers)
}

// countOnChain reads the token's Transfer and AuthorizationUsed logs in [from, to] and the
// receipts of those blocks, and matches them with pays (each has its own payee).
func countOnChain(ctx context.Context, n *node, tok common.Address, from, to uint64, pays []*payment, senders []common.Address) (ChainCount, error) {
	c := ChainCount{Blocks: to - from + 1}
	payees := make(map[common.Address]int, len(pays))
	auths := make(map[[2]common.Hash]int, len(pays))
	for _, p := range pays {
		payees[p.Auth.To] = 0
		auths[[2]common.Hash{common.BytesToHash(p.Auth.From[:]), p.Auth.Nonce}] = 0
	}
	const span = 1000
	for lo := from; lo <= to; lo += span {
		hi := min(lo+span-1, to)
		var logs []types.Log
		if err := n.call(ctx, &logs, "eth_getLogs", map[string]any{"fromBlock": hexutil.Uint64(lo), "toBlock": hexutil.Uint64(hi),
			"address": tok, "topics": [][]common.Hash{{eip3009.TransferTopic, eip3009.AuthorizationUsedTopic}}}); err != nil {
			return c, err
		}
		for _, l := range logs {
			if len(l.Topics) < 3 {
				continue
			}
			switch l.Topics[0] {
			case eip3009.TransferTopic:
				if k, ok := payees[common.BytesToAddress(l.Topics[2][:])]; ok {
					payees[common.BytesToAddress(l.Topics[2][:])] = k + 1
				}
			case eip3009.AuthorizationUsedTopic:
				key := [2]common.Hash{l.Topics[1], l.Topics[2]}
				if k, ok := auths[key]; ok {
					auths[key] = k + 1
				}
			}
		}
	}
	for _, k := range payees {
		if k > 0 {
			c.Transfers++
		}
		if k > 1 {
			c.Duplicates++
		}
	}
	for _, k := range auths {
		if k > 0 {
			c.AuthorizationsUsed++
		}
		if k > 1 {
			c.Duplicates++
		}
	}
	isSender := make(map[common.Address]bool, len(senders))
	for _, s := range senders {
		isSender[s] = true
	}
	const perBatch = 100
	for lo := from; lo <= to; lo += perBatch {
		hi := min(lo+perBatch-1, to)
		results := make([][]struct {
			From    common.Address `json:"from"`
			Status  hexutil.Uint64 `json:"status"`
			GasUsed hexutil.Uint64 `json:"gasUsed"`
		}, hi-lo+1)
		elems := make([]rpc.BatchElem, len(results))
		for i := range elems {
			elems[i] = rpc.BatchElem{Method: "eth_getBlockReceipts", Args: []any{hexutil.Uint64(lo + uint64(i))}, Result: &results[i]}
		}
		if err := n.batch(ctx, elems); err != nil {
			return c, fmt.Errorf("eth_getBlockReceipts: %w", err)
		}
		for i, e := range elems {
			if e.Error != nil {
				return c, fmt.Errorf("eth_getBlockReceipts %d: %w", lo+uint64(i), e.Error)
			}
			for _, r := range results[i] {
				if isSender[r.From] {
					c.SenderTxs++
					c.SenderGas += uint64(r.GasUsed)
					if r.Status == 0 {
						c.SenderReverted++
					}
				}
			}
		}
	}
	return c, nil
}

// CeilingResult is the chain's own rate for pre-signed transferWithAuthorization transactions.
type CeilingResult struct {
	Mode    string // "one per request" or "batches of N"
	N       int
	Elapsed time.Duration // first send to the last one mined
	Nudges  int           // evm_mine calls made when anvil left ready transactions waiting
	Chain   ChainCount
}

// Rate is mined transactions per second.
func (r CeilingResult) Rate() float64 {
	return rate(r.Chain.SenderTxs-r.Chain.SenderReverted, r.Elapsed)
}

// ceilingTxs pre-signs n EIP-1559 transferWithAuthorization transactions from key with sequential
// nonces and a fixed gas limit; the key's account is also the payer of each authorization.
func ceilingTxs(ctx context.Context, n *node, tok token, key *ecdsa.PrivateKey, count int) ([]string, []*payment, error) {
	sender := crypto.PubkeyToAddress(key.PublicKey)
	nonce, err := n.nonceAt(ctx, sender, "pending")
	if err != nil {
		return nil, nil, err
	}
	var head struct {
		BaseFee hexutil.Big `json:"baseFeePerGas"`
	}
	if err := n.call(ctx, &head, "eth_getBlockByNumber", "latest", false); err != nil {
		return nil, nil, err
	}
	tip := big.NewInt(1_000_000_000)
	// Three times the base fee leaves room for it to rise while the burst is mined.
	feeCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee.ToInt(), big.NewInt(3)), tip)
	signer := ethrpc.NewSigner(tok.ChainID, key)
	raws := make([]string, count)
	pays := make([]*payment, count)
	for i := range raws {
		p, err := signPayment(tok, key, time.Hour, "")
		if err != nil {
			return nil, nil, err
		}
		pays[i] = p
		// Gas about 96,000 used; fixed so that no estimate is part of the loop.
		tx, err := signer.Sign(nonce+uint64(i), &tok.Address, eip3009.TransferCalldata(p.Auth, p.Signature), 150_000, tip, feeCap)
		if err != nil {
			return nil, nil, err
		}
		b, err := tx.MarshalBinary()
		if err != nil {
			return nil, nil, err
		}
		raws[i] = hexutil.Encode(b)
	}
	return raws, pays, nil
}

// runCeiling sends raws (sequential nonces from sender, starting at the sender's mined nonce) in
// groups of batch per request (1: one eth_sendRawTransaction per request), with at most window
// transactions unconfirmed, until all are mined. The window keeps anvil 1.7.1 away from the
// auto-mine jam it hits at about 1,000 pending transactions.
//
// anvil 1.7.1 can also strand a transaction for good: on a loaded machine, one that arrived while
// its predecessor was still pending stays "queued" after the predecessor is mined, so evm_mine
// leaves it out and a resend is refused as "already imported". When a nudge did not help, the
// pool is emptied and every transaction sent so far and not mined is sent again in nonce order.
func runCeiling(ctx context.Context, n *node, sender common.Address, raws []string, batch, window, inFlight int) (elapsed time.Duration, nudges int, err error) {
	start, err := n.nonceAt(ctx, sender, "latest")
	if err != nil {
		return 0, 0, err
	}
	total := uint64(len(raws))
	var mined atomic.Uint64 // transactions of this run mined so far
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	groups := make(chan [2]int)
	var wg sync.WaitGroup
	var sendErr atomic.Pointer[error]
	var sent atomic.Uint64 // raws[:sent] have been handed to a send (raised before it starts)
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range groups {
				// Wait for room in the window.
				for uint64(g[1]) > mined.Load()+uint64(window) {
					select {
					case <-ctx.Done():
						return
					case <-time.After(2 * time.Millisecond):
					}
				}
				for hi := sent.Load(); uint64(g[1]) > hi && !sent.CompareAndSwap(hi, uint64(g[1])); hi = sent.Load() {
				}
				if err := sendRaw(ctx, n, raws[g[0]:g[1]]); err != nil {
					sendErr.CompareAndSwap(nil, &err)
					cancel(err)
					return
				}
			}
		}()
	}
	begin := time.Now()
	go func() {
		defer close(groups)
		for lo := 0; lo < len(raws); lo += batch {
			select {
			case groups <- [2]int{lo, min(lo+batch, len(raws))}:
			case <-ctx.Done():
				return
			}
		}
	}()

	lastProgress := time.Now()
	nudged := false // the last nudge has not been followed by progress
	for mined.Load() < total {
		select {
		case <-ctx.Done():
			wg.Wait()
			if p := sendErr.Load(); p != nil {
				return 0, nudges, *p
			}
			return 0, nudges, fmt.Errorf("%d of %d mined: %w", mined.Load(), total, context.Cause(ctx))
		case <-time.After(5 * time.Millisecond):
		}
		nonce, err := n.nonceAt(ctx, sender, "latest")
		if err != nil {
			return 0, nudges, err
		}
		if nonce-start > mined.Load() {
			mined.Store(nonce - start)
			lastProgress, nudged = time.Now(), false
		} else if time.Since(lastProgress) > 2*time.Second {
			if nudged {
				if err := resendStranded(ctx, n, raws[nonce-start:sent.Load()]); err != nil {
					return 0, nudges, err
				}
			}
			// anvil (auto-mine) leaves ready transactions that missed the last block waiting
			// for the next arrival; at the end of a burst nothing arrives.
			if err := n.call(ctx, nil, "evm_mine"); err != nil {
				return 0, nudges, err
			}
			nudges++
			lastProgress, nudged = time.Now(), true
		}
	}
	elapsed = time.Since(begin)
	wg.Wait()
	return elapsed, nudges, nil
}

// resendStranded empties anvil's pool and sends raws again one by one, in nonce order. A
// transaction a sender goroutine sends at the same time is refused as known or mined; only a
// failure of the node itself counts.
func resendStranded(ctx context.Context, n *node, raws []string) error {
	if err := n.call(ctx, nil, "anvil_dropAllTransactions"); err != nil {
		return err
	}
	for _, r := range raws {
		var h common.Hash
		if err := n.call(ctx, &h, "eth_sendRawTransaction", r); err != nil {
			var rpcErr rpc.Error
			if !errors.As(err, &rpcErr) {
				return err
			}
		}
	}
	return nil
}

func sendRaw(ctx context.Context, n *node, raws []string) error {
	if len(raws) == 1 {
		var h common.Hash
		return n.call(ctx, &h, "eth_sendRawTransaction", raws[0])
	}
	elems := make([]rpc.BatchElem, len(raws))
	hashes := make([]common.Hash, len(raws))
	for i, r := range raws {
		elems[i] = rpc.BatchElem{Method: "eth_sendRawTransaction", Args: []any{r}, Result: &hashes[i]}
	}
	if err := n.batch(ctx, elems); err != nil {
		return fmt.Errorf("eth_sendRawTransaction batch: %w", err)
	}
	var errs []error
	for _, e := range elems {
		if e.Error != nil {
			errs = append(errs, e.Error)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("eth_sendRawTransaction batch: %d of %d failed: %w", len(errs), len(raws), errors.Join(errs[0]))
	}
	return nil
}

// mentionsNonce reports whether an answer's reason or message is about a nonce.
func mentionsNonce(s ...string) bool {
	for _, x := range s {
		if strings.Contains(strings.ToLower(x), "nonce") {
			return true
		}
	}
	return false
}
