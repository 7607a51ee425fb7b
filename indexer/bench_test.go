package indexer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/indexer"
)

// BenchmarkBackfill measures backfill throughput, events per second from anvil into Postgres, with
// the default log ranges: 100,000 events (50,000 Transfer and 50,000 AuthorizationUsed, from
// devchain/testdata/Emitter.sol) in 50 blocks, indexed from block 0 to the head.
//
//	go test ./indexer/ -run '^$' -bench BenchmarkBackfill -benchtime 1x
func BenchmarkBackfill(b *testing.B) {
	const calls, perCall = 50, 1000 // each call emits 2*perCall events
	emitter, events := emitterChain(b, calls, perCall)
	top := head(b)
	var took time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		network := fmt.Sprintf("%s#%s-%d", chainNetwork(), b.Name(), i)
		if err := store.BindNetwork(context.Background(), network, chain.ChainID, genesis); err != nil {
			b.Fatal(err)
		}
		cfg := indexer.Config{Network: network, Tokens: []common.Address{emitter}, Chain: chain.RPC, WSURL: chain.WSURL,
			Store: store, FinalityDepth: 2, PollInterval: 50 * time.Millisecond}
		b.StartTimer()
		begin := time.Now()
		r := start(b, cfg)
		st := r.waitCursor(b, top, 5*time.Minute)
		took += time.Since(begin)
		b.StopTimer()
		if err := r.stop(); err != nil {
			b.Fatal(err)
		}
		var stored int
		if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transfers WHERE network = $1)
			+ (SELECT count(*) FROM authorization_events WHERE network = $1)`, network).Scan(&stored); err != nil {
			b.Fatal(err)
		}
		if stored != events || st.Events != int64(events) {
			b.Fatalf("stored %d rows, the indexer reports %d events; the chain has %d", stored, st.Events, events)
		}
	}
	// For scale: the one eth_getLogs (decoded into go-ethereum logs, as the indexer does) alone.
	begin := time.Now()
	var logs []types.Log
	if err := chain.RPC.CallContext(context.Background(), &logs, "eth_getLogs", map[string]any{"fromBlock": "0x0",
		"toBlock": hexutil.EncodeUint64(top), "address": []common.Address{emitter}}); err != nil || len(logs) != events {
		b.Fatalf("eth_getLogs: %d logs, %v", len(logs), err)
	}
	getLogs := time.Since(begin)
	eps := float64(events*b.N) / took.Seconds()
	b.ReportMetric(eps, "events/s")
	b.ReportMetric(float64(events), "events")
	b.ReportMetric(float64(top+1), "blocks")
	b.Logf("backfill: %d events in blocks 0..%d indexed in %s per run: %.0f events/s (one eth_getLogs of them all alone: %s)",
		events, top, (took / time.Duration(b.N)).Round(time.Millisecond), eps, getLogs.Round(time.Millisecond))
}

func chainNetwork() string { return fmt.Sprintf("eip155:%d", chain.ChainID) }

// emitterChain deploys Emitter.sol and has it emit calls*2*perCall events, then mines enough
// empty blocks that all of them are below the indexer's unfinalized window (so backfill reads
// them). It returns the contract and the number of events.
func emitterChain(b *testing.B, calls, perCall int) (common.Address, int) {
	b.Helper()
	begin := time.Now()
	abiJSON, code := compileEmitter(b)
	a, err := abi.JSON(bytes.NewReader(abiJSON))
	if err != nil {
		b.Fatal(err)
	}
	s := newTxSenders(b, 1)[0]
	rc := sendAll(b, []*types.Transaction{s.sign(b, nil, code, 1_000_000)}, 1)
	emitter := rc[0].ContractAddress
	data, err := a.Pack("emitMany", big.NewInt(int64(perCall)))
	if err != nil {
		b.Fatal(err)
	}
	var txs []*types.Transaction
	for range calls {
		txs = append(txs, s.sign(b, &emitter, data, 10_000_000))
	}
	rcpts := sendAll(b, txs, 10)
	events := 0
	for _, r := range rcpts {
		events += len(r.Logs)
	}
	if events != calls*2*perCall {
		b.Fatalf("the emitter emitted %d events, want %d", events, calls*2*perCall)
	}
	mine(b, 200)
	b.Logf("chain: %d events from %s in %d transactions, head %d; built in %s", events, emitter, calls, head(b), time.Since(begin).Round(time.Millisecond))
	return emitter, events
}

// compileEmitter compiles devchain/testdata/Emitter.sol with solc-js, the way devchain compiles
// its SmartWallet: node devchain/solc.mjs <file> <node_modules>.
func compileEmitter(b *testing.B) (abiJSON []byte, code []byte) {
	b.Helper()
	root, err := moduleRoot()
	if err != nil {
		b.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		b.Fatalf("node is needed to compile Emitter.sol: %v", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(node, filepath.Join(root, "devchain", "solc.mjs"), filepath.Join(root, "devchain", "testdata", "Emitter.sol"),
		filepath.Join(root, "node_modules"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("compiling Emitter.sol: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var out struct {
		ABI      json.RawMessage `json:"abi"`
		Bytecode string          `json:"bytecode"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		b.Fatalf("solc.mjs output: %v", err)
	}
	code, err = hexutil.Decode(out.Bytecode)
	if err != nil || len(code) == 0 {
		b.Fatalf("Emitter bytecode: %v", err)
	}
	return out.ABI, code
}

// moduleRoot is the directory holding go.mod, walking up from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}
