package settle_test

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync/atomic"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// faultChain puts the answers of a load-balanced provider's worse backends in front of the node,
// as the test switches them on: receipts that read null or fail though mined, and batches answered
// by a backend that lags the head by some blocks (single calls still reach an up-to-date one).
type faultChain struct {
	ethrpc.Chain
	badReceipts atomic.Bool  // receipts read null (odd calls) or fail (even calls)
	lagBatches  atomic.Int64 // batches answered as a node this many blocks behind
	calls       atomic.Int64
}

var errHeaderNotFound = errors.New("header not found")

func (c *faultChain) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	lag := uint64(c.lagBatches.Load())
	var head uint64
	if lag > 0 {
		var h hexutil.Uint64
		if err := c.Chain.CallContext(ctx, &h, "eth_blockNumber"); err != nil {
			return err
		}
		head = uint64(h) - min(lag, uint64(h))
	}
	type local struct {
		i    int
		null bool
		err  error
	}
	var fwd []rpc.BatchElem
	var idx []int
	var answered []local
	for i, el := range b {
		el := el
		if lag > 0 {
			if null, err, ok := c.lagged(&el, head); ok {
				answered = append(answered, local{i, null, err})
				continue
			}
		}
		fwd = append(fwd, el)
		idx = append(idx, i)
	}
	if len(fwd) > 0 {
		if err := c.Chain.BatchCallContext(ctx, fwd); err != nil {
			return err
		}
	}
	for j, el := range fwd {
		b[idx[j]].Error = el.Error
		if el.Method != "eth_getTransactionReceipt" || el.Error != nil {
			continue
		}
		r := el.Result.(**ethrpc.Receipt)
		switch {
		case *r != nil && lag > 0 && uint64(*(*r).BlockNumber) > head:
			*r = nil
		case *r != nil && c.badReceipts.Load():
			if c.calls.Add(1)%2 == 0 {
				b[idx[j]].Error = errors.New("upstream timeout")
			} else {
				*r = nil
			}
		}
	}
	for _, a := range answered {
		if a.null {
			v := reflect.ValueOf(b[a.i].Result).Elem()
			v.Set(reflect.Zero(v.Type()))
		}
		b[a.i].Error = a.err
	}
	return nil
}

// lagged answers el (ok) as a node whose head is head would, or rewrites it to be forwarded.
func (c *faultChain) lagged(el *rpc.BatchElem, head uint64) (null bool, err error, ok bool) {
	above := func(tag any) (uint64, bool) {
		s, _ := tag.(string)
		if s == "latest" || s == "pending" || s == "safe" || s == "finalized" {
			return 0, false
		}
		n, perr := strconv.ParseUint(s, 0, 64)
		return n, perr == nil && n > head
	}
	at := hexutil.EncodeUint64(head)
	switch el.Method {
	case "eth_blockNumber":
		*(el.Result.(*hexutil.Uint64)) = hexutil.Uint64(head)
		return false, nil, true
	case "eth_getBlockByNumber", "eth_getBlockReceipts":
		if _, hi := above(el.Args[0]); hi {
			return true, nil, true
		}
		if s, _ := el.Args[0].(string); s == "latest" || s == "pending" {
			el.Args = append([]any{at}, el.Args[1:]...)
		}
	case "eth_call", "eth_getTransactionCount", "eth_getBalance":
		last := len(el.Args) - 1
		if _, hi := above(el.Args[last]); hi {
			return false, errHeaderNotFound, true
		}
		if s, _ := el.Args[last].(string); s == "latest" || s == "pending" {
			args := append([]any(nil), el.Args...)
			args[last] = at
			el.Args = args
		}
	}
	return false, nil, false
}
