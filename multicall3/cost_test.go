package multicall3_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// BenchmarkAnvilCPU is what the chain node spends per transfer, from the kernel's accounting of
// anvil's process, for the shapes a settlement can take: the floor under `facilitator-dev bench`'s
// "chain node" figures. Per transfer, in anvil-ms/transfer:
//
//   - lone: one transferWithAuthorization transaction sent, mined in a block of its own, its
//     receipt read;
//
//   - batch-N: one aggregate3 transaction of N of them;
//
//   - sim-alone: one eth_call simulation of one (what a verify asks);
//
//   - sim-grouped-20: twenty simulations in one eth_simulateV1 (verify's simulations under load).
//
//     go test ./multicall3/ -run '^$' -bench BenchmarkAnvilCPU -benchtime 40x
func BenchmarkAnvilCPU(b *testing.B) {
	g := newGasBench(b)
	calls := func(n int) []multicall3.Call {
		out := make([]multicall3.Call, n)
		for i := range out {
			a, sig := g.authorize(1+i%9, 10)
			out[i] = multicall3.Call{Target: g.chain.USDC.Address, AllowFailure: true, CallData: eip3009.TransferCalldata(a, sig)}
		}
		return out
	}
	measure := func(b *testing.B, transfers int, prepare func() func()) {
		b.StopTimer()
		runs := make([]func(), b.N)
		for i := range runs {
			runs[i] = prepare()
		}
		before := anvilTicks(b, g.chain.PID())
		b.StartTimer()
		for _, run := range runs {
			run()
		}
		b.StopTimer()
		ms := float64(anvilTicks(b, g.chain.PID())-before) * 1000 / float64(clockTicks)
		b.ReportMetric(ms/float64(b.N*transfers), "anvil-ms/transfer")
	}
	b.Run("lone", func(b *testing.B) {
		measure(b, 1, func() func() {
			c := calls(1)[0]
			return func() { g.send(c.Target, c.CallData, 150_000) }
		})
	})
	for _, n := range []int{20, 50} {
		b.Run(fmt.Sprintf("batch-%d", n), func(b *testing.B) {
			measure(b, n, func() func() {
				data := multicall3.Aggregate3Calldata(calls(n))
				return func() {
					if r := g.send(multicall3.Address, data, uint64(n)*150_000); r.Status != 1 {
						b.Fatal("the batch reverted")
					}
				}
			})
		})
	}
	call := func(c multicall3.Call) map[string]any {
		return map[string]any{"from": g.sender.Address(), "to": c.Target, "gas": hexutil.Uint64(150_000), "input": hexutil.Bytes(c.CallData)}
	}
	b.Run("sim-alone", func(b *testing.B) {
		measure(b, 1, func() func() {
			c := calls(1)[0]
			return func() {
				var out hexutil.Bytes
				if err := g.chain.RPC.CallContext(g.ctx, &out, "eth_call", call(c), "latest"); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("sim-grouped-20", func(b *testing.B) {
		measure(b, 20, func() func() {
			var in []map[string]any
			for _, c := range calls(20) {
				in = append(in, call(c))
			}
			return func() {
				var out []struct {
					Calls []struct {
						Status hexutil.Uint64 `json:"status"`
					} `json:"calls"`
				}
				err := g.chain.RPC.CallContext(g.ctx, &out, "eth_simulateV1", map[string]any{"blockStateCalls": []any{map[string]any{"calls": in}}}, "latest")
				if err != nil || len(out) != 1 || len(out[0].Calls) != 20 {
					b.Fatalf("eth_simulateV1: %v", err)
				}
				for _, c := range out[0].Calls {
					if c.Status != 1 {
						b.Fatal("a grouped simulation failed")
					}
				}
			}
		})
	})
}

// clockTicks is the kernel's USER_HZ, which /proc/<pid>/stat counts in: 100 on Linux.
const clockTicks = 100

func anvilTicks(b *testing.B, pid int) uint64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("anvil's CPU: %v", err)
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	f := bytes.Fields(raw[bytes.LastIndexByte(raw, ')')+2:])
	utime, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("anvil's CPU: %s", raw)
	}
	return utime + stime
}
