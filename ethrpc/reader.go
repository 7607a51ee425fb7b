package ethrpc

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
)

// Read is one eth_getCode (Code set), eth_estimateGas (Estimate set, from From) or eth_call
// (from From when set, with a gas limit of GasCap when set).
type Read struct {
	Code     bool
	Estimate bool
	From     common.Address
	To       common.Address
	Data     []byte
	// GasCap, on an eth_call, runs it with this gas limit: running out of gas then counts as a
	// revert (whatever the node calls it), not as a node that could not answer.
	GasCap uint64
	// Simulate marks an eth_call that simulates a transaction (a transfer /verify or /settle
	// judges): the Reader may run it together with other callers' simulations (simulate.go).
	Simulate bool
	// Depends and Changes, on a Simulate read, are the accounts whose state (at the called
	// contract) decides the call's outcome, and those whose state it changes. A simulation is run
	// together with others only when it names what it changes, and never with one whose Changes
	// meet its Depends or whose Depends meet its Changes (compatible, in simulate.go).
	Depends, Changes []common.Address
	// GasDepends and GasSurcharge, on a Simulate call at a GasCap, are accounts whose state
	// decides only how much gas the call needs, by at most GasSurcharge (a transfer to an account
	// holding nothing sets a storage slot from zero). In a group, after a call that changed one
	// of them, the call runs at GasCap less GasSurcharge: a success there is a success alone.
	GasDepends   []common.Address
	GasSurcharge uint64

	Out          []byte
	Gas          uint64 // eth_estimateGas's answer
	Reverted     bool
	RevertReason string
	// Grouped says the answer came from a group's eth_simulateV1: the call ran after other
	// callers' calls that changed none of its Depends. What Depends cannot name (a contract
	// wallet's isValidSignature may read any state) the caller judges again alone.
	Grouped bool
}

// Reader reads through a JSON-RPC node, batching the reads of one step into one request.
//
// Each request also asks for the head of the node that answers it. Behind a load balancer a
// backend can lag by blocks: its "latest" state can say a payer just funded has no balance, or an
// authorization just used is free. An answer from a node behind the highest head this reader has
// seen is not used: the request is made again (another backend may take it), and after
// laggingTries the read fails (not known: the caller answers 503, never a false verdict).
type Reader struct {
	Chain Chain
	// Timeout bounds each round trip.
	Timeout time.Duration
	// Queued, when set, is called each time a caller joins the group of simulations waiting
	// behind the one in flight: a test seam, for tests that build a group in a known order.
	Queued func()

	head atomic.Uint64 // the highest head an answer came from
	sims simulations
}

// laggingTries is how many requests a read makes while the answering nodes lag.
const laggingTries = 3

type callArgs struct {
	From  *common.Address `json:"from,omitempty"`
	To    common.Address  `json:"to"`
	Gas   *hexutil.Uint64 `json:"gas,omitempty"`
	Input hexutil.Bytes   `json:"input"`
}

// Read performs reads against the latest block, in one round trip where the transport allows.
// A call the node executed and rejected sets Read.Reverted; any other failure is returned,
// because then nothing is known about the call. Reads with Simulate set may share one
// eth_simulateV1 with other callers' (simulate.go).
func (r *Reader) Read(ctx context.Context, reads ...*Read) error {
	if len(reads) == 0 {
		return nil
	}
	for _, rd := range reads {
		if rd.simulated() {
			return r.sims.read(ctx, r, reads)
		}
	}
	return r.read(ctx, reads)
}

// read performs reads in one batch, each its own JSON-RPC call.
func (r *Reader) read(ctx context.Context, reads []*Read) error {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	batch, results := readElems(reads)
	if err := r.batch(ctx, batch); err != nil {
		return err
	}
	return applyReads(reads, batch, results)
}

func (r *Reader) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.Timeout > 0 {
		return context.WithTimeout(ctx, r.Timeout)
	}
	return ctx, func() {}
}

// readResult is where one read's answer is decoded.
type readResult struct {
	out hexutil.Bytes
	gas hexutil.Uint64
}

func readElems(reads []*Read) ([]rpc.BatchElem, []readResult) {
	results := make([]readResult, len(reads))
	batch := make([]rpc.BatchElem, len(reads))
	for i, rd := range reads {
		switch {
		case rd.Code:
			batch[i] = rpc.BatchElem{Method: "eth_getCode", Args: []any{rd.To, "latest"}, Result: &results[i].out}
		case rd.Estimate:
			from := rd.From
			batch[i] = rpc.BatchElem{Method: "eth_estimateGas", Args: []any{callArgs{From: &from, To: rd.To, Input: rd.Data}}, Result: &results[i].gas}
		default:
			batch[i] = rpc.BatchElem{Method: "eth_call", Args: []any{rd.callArgs(), "latest"}, Result: &results[i].out}
		}
	}
	return batch, results
}

func (rd *Read) callArgs() callArgs {
	args := callArgs{To: rd.To, Input: rd.Data}
	if rd.From != (common.Address{}) {
		from := rd.From
		args.From = &from
	}
	if rd.GasCap > 0 {
		g := hexutil.Uint64(rd.GasCap)
		args.Gas = &g
	}
	return args
}

// applyReads sets each read's answer from its element of a batch that r.batch answered.
func applyReads(reads []*Read, batch []rpc.BatchElem, results []readResult) error {
	for i, rd := range reads {
		if e := batch[i].Error; e != nil {
			outOfGas := rd.GasCap > 0 && strings.Contains(strings.ToLower(e.Error()), "gas")
			if rd.Code || !(isExecutionError(e) || outOfGas) {
				return fmt.Errorf("%s %s: %w", batch[i].Method, rd.To, e)
			}
			rd.Reverted, rd.Grouped = true, false
			rd.RevertReason = revertText(e)
			continue
		}
		rd.Out, rd.Gas, rd.Grouped = results[i].out, uint64(results[i].gas), false
	}
	return nil
}

// batch sends elems in one request with the answering node's head, made again while that head is
// behind the highest this reader has seen (see Reader). The elements' answers are in place when it
// returns nil; an element's own error is left for the caller to judge.
func (r *Reader) batch(ctx context.Context, elems []rpc.BatchElem) error {
	var head hexutil.Uint64
	batch := append([]rpc.BatchElem{{Method: "eth_blockNumber", Result: &head}}, elems...)
	seen := r.head.Load()
	highest := uint64(0)
	for try := 1; ; try++ {
		for i := range batch {
			batch[i].Error = nil
		}
		if err := r.Chain.BatchCallContext(ctx, batch); err != nil {
			return err
		}
		if batch[0].Error != nil {
			return fmt.Errorf("eth_blockNumber: %w", batch[0].Error)
		}
		highest = max(highest, uint64(head))
		if uint64(head) >= seen {
			break
		}
		if try == laggingTries {
			// A chain reorganised to a shorter one looks the same as lag: the next read takes the
			// highest head these answers had.
			r.head.Store(highest)
			return fmt.Errorf("the node answering is behind the chain's head (block %d, %d seen): not known yet", uint64(head), seen)
		}
	}
	for {
		old := r.head.Load()
		if uint64(head) <= old || r.head.CompareAndSwap(old, uint64(head)) {
			break
		}
	}
	copy(elems, batch[1:])
	return nil
}

// isExecutionError tells a call the node ran and rejected (a revert, an invalid opcode) from a
// node that could not answer (rate limits, overload, its own execution timeout or gas cap), which
// must not be read as a verdict on the payment. When in doubt it says "could not answer": a 503
// costs a retry, a false verdict costs a sale.
func isExecutionError(err error) bool {
	var rpcErr rpc.Error
	if !errors.As(err, &rpcErr) {
		return false
	}
	if rpcErr.ErrorCode() == 3 {
		return true
	}
	msg := strings.ToLower(rpcErr.Error())
	for _, s := range []string{"aborted", "timeout", "timed out", "gas cap", "gas limit", "rate", "capacity"} {
		if strings.Contains(msg, s) {
			return false
		}
	}
	for _, s := range []string{"revert", "evmerror", "invalid opcode"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func revertText(err error) string {
	msg := err.Error()
	var de rpc.DataError
	if errors.As(err, &de) {
		if s, ok := de.ErrorData().(string); ok && s != "" && !strings.Contains(msg, s) {
			msg += " (data " + s + ")"
		}
	}
	if len(msg) > 500 {
		msg = msg[:500]
	}
	return msg
}

// Ready reports whether the node answers (eth_blockNumber), within Timeout. The error is short
// and safe to show: a transport error names its cause, not the RPC URL, which can hold a
// provider's API key.
func (r *Reader) Ready(ctx context.Context) error {
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	var head hexutil.Uint64
	err := r.Chain.CallContext(ctx, &head, "eth_blockNumber")
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err
	}
	return err
}
