package indexer_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// TestLaggingLogsLeaveNoGap: two endpoints behind one name, as a pool rotates them: the head and
// the headers come from the node at the chain's head, while every other log read goes to a node
// still at block lagAt, which answers the logs it has (a range past its head clipped to it, as
// some providers do). No range may be marked indexed on logs from a node that lacked its blocks:
// the index must equal the chain's logs.
func TestLaggingLogsLeaveNoGap(t *testing.T) {
	cfg := freshConfig(t)
	network := cfg.Network
	sender := gasAccount(t)
	for i := range 2 {
		payOnce(t, chain.Accounts[8], sender, int64(1+i))
	}
	lagAt := head(t)
	for i := range 3 {
		payOnce(t, chain.Accounts[8], sender, int64(10+i))
		mine(t, 2)
	}
	top := head(t)
	split := &logSplitter{Chain: chain.RPC, lagAt: lagAt}
	cfg.Chain = split
	r := start(t, cfg)
	r.waitCursor(t, top, 20*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	c := compareWithChain(t, network, cfg.Tokens, cfg.StartBlock, top)
	if c.used != 5 {
		t.Errorf("indexed %+v, want 5 authorizations", c)
	}
	if split.lagged == 0 {
		t.Fatal("no log read went to the lagging node: the test proves nothing")
	}
}

// logSplitter sends every other request that reads logs to a node at block lagAt; the rest, and
// every other request, to the node at the head.
type logSplitter struct {
	ethrpc.Chain
	lagAt uint64

	mu     sync.Mutex
	reads  int // requests that read logs
	lagged int // of them, answered by the lagging node
}

func (s *logSplitter) lags(elems []rpc.BatchElem) bool {
	for _, el := range elems {
		if el.Method == "eth_getLogs" {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.reads++
			if s.reads%2 == 1 {
				s.lagged++
				return true
			}
			return false
		}
	}
	return false
}

func (s *logSplitter) CallContext(ctx context.Context, result any, method string, args ...any) error {
	b := []rpc.BatchElem{{Method: method, Args: args, Result: result}}
	if err := s.BatchCallContext(ctx, b); err != nil {
		return err
	}
	return b[0].Error
}

func (s *logSplitter) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	if !s.lags(b) {
		return s.Chain.BatchCallContext(ctx, b)
	}
	for i := range b {
		b[i].Error = s.lagging(ctx, &b[i])
	}
	return nil
}

// lagging answers one call as the node at lagAt does.
func (s *logSplitter) lagging(ctx context.Context, el *rpc.BatchElem) error {
	switch el.Method {
	case "eth_blockNumber":
		return s.Chain.CallContext(ctx, el.Result, el.Method, el.Args...) // the pool's head is another node's
	case "eth_getBlockByNumber":
		if n, err := hexutil.DecodeUint64(el.Args[0].(string)); err == nil && n > s.lagAt {
			return json.Unmarshal([]byte("null"), el.Result)
		}
	case "eth_getLogs":
		raw, err := json.Marshal(el.Args[0])
		if err != nil {
			return err
		}
		var q map[string]any
		if err := json.Unmarshal(raw, &q); err != nil {
			return err
		}
		from, _ := hexutil.DecodeUint64(q["fromBlock"].(string))
		to, _ := hexutil.DecodeUint64(q["toBlock"].(string))
		if from > s.lagAt {
			return json.Unmarshal([]byte("[]"), el.Result)
		}
		q["toBlock"] = hexutil.EncodeUint64(min(to, s.lagAt))
		return s.Chain.CallContext(ctx, el.Result, el.Method, q)
	}
	return s.Chain.CallContext(ctx, el.Result, el.Method, el.Args...)
}
