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

	Out          []byte
	Gas          uint64 // eth_estimateGas's answer
	Reverted     bool
	RevertReason string
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

	head atomic.Uint64 // the highest head an answer came from
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
// because then nothing is known about the call.
func (r *Reader) Read(ctx context.Context, reads ...*Read) error {
	if len(reads) == 0 {
		return nil
	}
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	out := make([]hexutil.Bytes, len(reads))
	gas := make([]hexutil.Uint64, len(reads))
	batch := make([]rpc.BatchElem, len(reads))
	for i, rd := range reads {
		switch {
		case rd.Code:
			batch[i] = rpc.BatchElem{Method: "eth_getCode", Args: []any{rd.To, "latest"}, Result: &out[i]}
		case rd.Estimate:
			from := rd.From
			batch[i] = rpc.BatchElem{Method: "eth_estimateGas", Args: []any{callArgs{From: &from, To: rd.To, Input: rd.Data}}, Result: &gas[i]}
		default:
			args := callArgs{To: rd.To, Input: rd.Data}
			if rd.From != (common.Address{}) {
				from := rd.From
				args.From = &from
			}
			if rd.GasCap > 0 {
				g := hexutil.Uint64(rd.GasCap)
				args.Gas = &g
			}
			batch[i] = rpc.BatchElem{Method: "eth_call", Args: []any{args, "latest"}, Result: &out[i]}
		}
	}
	var head hexutil.Uint64
	batch = append([]rpc.BatchElem{{Method: "eth_blockNumber", Result: &head}}, batch...)
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
	batch = batch[1:]
	for i, rd := range reads {
		if e := batch[i].Error; e != nil {
			outOfGas := rd.GasCap > 0 && strings.Contains(strings.ToLower(e.Error()), "gas")
			if rd.Code || !(isExecutionError(e) || outOfGas) {
				return fmt.Errorf("%s %s: %w", batch[i].Method, rd.To, e)
			}
			rd.Reverted = true
			rd.RevertReason = revertText(e)
			continue
		}
		rd.Out, rd.Gas = out[i], uint64(gas[i])
	}
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
