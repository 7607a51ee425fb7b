package indexer_test

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestBackfillMatchesGetLogs indexes a chain holding more than 10,000 USDC events (mints,
// transferWithAuthorization from many payers, cancelAuthorization) from block 0, through an RPC
// that refuses large log ranges the way hosted providers do, and compares every indexed row with
// a direct eth_getLogs.
func TestBackfillMatchesGetLogs(t *testing.T) {
	const (
		payerCount  = 50
		authCount   = 5000 // each emits AuthorizationUsed + Transfer
		cancelCount = 25
		senderCount = 10
		batch       = 200
	)
	network := bindNetwork(t)
	begin := time.Now()
	// Empty blocks first: there the range grows past the provider's block limit, which refuses it.
	mine(t, 300)

	payers := make([]*devchain.Account, payerCount)
	for i := range payers {
		k, err := crypto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		payers[i] = &devchain.Account{Key: k, Address: crypto.PubkeyToAddress(k.PublicKey)}
		if err := chain.USDC.Mint(context.Background(), payers[i].Address, big.NewInt(1_000_000_000_000)); err != nil {
			t.Fatal(err)
		}
	}
	recipients := make([]common.Address, 200)
	for i := range recipients {
		recipients[i] = randomAddress(t)
	}
	senders := newTxSenders(t, senderCount)
	minted := time.Since(begin)

	var txs []*types.Transaction
	var canceled []settled
	for i := range authCount {
		payer := payers[i%payerCount]
		a := devchain.TransferAuthorization{From: payer.Address, To: recipients[i%len(recipients)], Value: big.NewInt(int64(1 + i%997*1000)),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Unix() + 3600), Nonce: stacktest.Random32(t)}
		txs = append(txs, senders[i%senderCount].sign(t, &chain.USDC.Address, packTransferWithAuthorization(t, payer.Key, a), 150_000))
		if i%(authCount/cancelCount) == authCount/cancelCount/2 {
			c := settled{payer: payer.Address, nonce: stacktest.Random32(t)}
			canceled = append(canceled, c)
			s := senders[(i+1)%senderCount]
			txs = append(txs, s.sign(t, &chain.USDC.Address, packCancelAuthorization(t, payer.Key, c.nonce), 100_000))
		}
	}
	signed := time.Since(begin) - minted
	rcpts := sendAll(t, txs, batch)
	sent := time.Since(begin) - minted - signed
	// Empty blocks on top: the unfinalized window, which the indexer reads in one eth_getLogs of up
	// to 128 blocks whatever the range sizer says, holds no logs, so only backfill ranges meet the
	// provider's limits (TestLiveRangeRespectsProviderLimits covers the window).
	mine(t, 200)
	top := head(t)
	blocks := map[uint64]bool{}
	for _, r := range rcpts {
		blocks[r.BlockNumber.Uint64()] = true
	}
	t.Logf("chain: %d payers minted in %s; %d transactions signed in %s, sent and mined in %s (%.0f tx/s) into %d blocks; head %d",
		payerCount, minted.Round(time.Millisecond), len(txs), signed.Round(time.Millisecond), sent.Round(time.Millisecond),
		float64(len(txs))/sent.Seconds(), len(blocks), top)

	limiter := &rangeLimiter{Chain: chain.RPC, maxBlocks: 128, maxLogs: 1000}
	cfg := config(network)
	cfg.Chain = limiter
	cfg.InitialRange = 4 // so the range has to grow, then shrink on refusals, then grow again
	indexing := time.Now()
	r := start(t, cfg)
	st := r.waitCursor(t, top, 60*time.Second)
	took := time.Since(indexing)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	c := compareWithChain(t, network, cfg.Tokens, 0, top)
	t.Logf("indexed %d events (%d transfers, %d used, %d canceled) of blocks 0..%d in %s (%.0f events/s); getLogs refusals: %d by range, %d by result size; largest range served %d",
		c.total(), c.transfers, c.used, c.canceled, top, took.Round(time.Millisecond), float64(c.total())/took.Seconds(),
		limiter.refusedSpan, limiter.refusedLogs, limiter.largest)
	if c.used != authCount || c.canceled != cancelCount || c.transfers < authCount+payerCount {
		t.Errorf("chain holds %+v, want %d used, %d canceled, at least %d transfers", c, authCount, cancelCount, authCount+payerCount)
	}
	if c.total() < 10_000 {
		t.Errorf("only %d events on chain, want at least 10,000", c.total())
	}
	if st.Events != int64(c.total()) {
		t.Errorf("the indexer reports %d events indexed, the chain has %d", st.Events, c.total())
	}
	if st.Reorgs != 0 {
		t.Errorf("%d reorgs reported on a chain that never reorganised", st.Reorgs)
	}
	if limiter.refusedSpan == 0 || limiter.refusedLogs == 0 {
		t.Errorf("the log ranges never had to adapt (refusals: %d by range, %d by size)", limiter.refusedSpan, limiter.refusedLogs)
	}
	for _, x := range canceled {
		used, err := chain.USDC.AuthorizationState(context.Background(), x.payer, x.nonce)
		if err != nil || !used {
			t.Errorf("canceled nonce %x of %s: state %v, %v", x.nonce, x.payer, used, err)
		}
	}
	cursor, kept := checkWindow(t, network)
	t.Logf("cursor %d, %d window blocks kept; test took %s", cursor, kept, time.Since(begin).Round(time.Millisecond))
}

// packTransferWithAuthorization signs a with key and packs the (v, r, s) transferWithAuthorization call.
func packTransferWithAuthorization(t testing.TB, key *ecdsa.PrivateKey, a devchain.TransferAuthorization) []byte {
	t.Helper()
	sig, err := chain.USDC.SignTransferAuthorization(key, a)
	if err != nil {
		t.Fatal(err)
	}
	data, err := chain.USDC.ABI.Pack(overload(t, "transferWithAuthorization", 9),
		a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, sig[64], [32]byte(sig[:32]), [32]byte(sig[32:64]))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// packCancelAuthorization signs EIP-3009's CancelAuthorization(authorizer, nonce) with key and
// packs the (v, r, s) cancelAuthorization call.
func packCancelAuthorization(t testing.TB, key *ecdsa.PrivateKey, nonce [32]byte) []byte {
	t.Helper()
	sig, err := chain.USDC.SignCancelAuthorization(key, nonce)
	if err != nil {
		t.Fatal(err)
	}
	data, err := chain.USDC.ABI.Pack(overload(t, "cancelAuthorization", 5), crypto.PubkeyToAddress(key.PublicKey), nonce,
		sig[64], [32]byte(sig[:32]), [32]byte(sig[32:64]))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// overload is go-ethereum's name for the overload of a USDC method with nargs arguments.
func overload(t testing.TB, raw string, nargs int) string {
	t.Helper()
	for name, m := range chain.USDC.ABI.Methods {
		if m.RawName == raw && len(m.Inputs) == nargs {
			return name
		}
	}
	t.Fatalf("USDC has no %s with %d arguments", raw, nargs)
	return ""
}

// rangeLimiter is an RPC that refuses eth_getLogs ranges wider than maxBlocks with an
// Alchemy-style hint, and results longer than maxLogs with a hint-less "more than N results".
type rangeLimiter struct {
	ethrpc.Chain
	maxBlocks uint64
	maxLogs   int

	mu                       sync.Mutex
	refusedSpan, refusedLogs int
	largest                  uint64
}

func (l *rangeLimiter) CallContext(ctx context.Context, result any, method string, args ...any) error {
	if method != "eth_getLogs" || len(args) != 1 {
		return l.Chain.CallContext(ctx, result, method, args...)
	}
	var f struct {
		FromBlock hexutil.Uint64 `json:"fromBlock"`
		ToBlock   hexutil.Uint64 `json:"toBlock"`
	}
	b, err := json.Marshal(args[0])
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("rangeLimiter: filter %s: %w", b, err)
	}
	from, to := uint64(f.FromBlock), uint64(f.ToBlock)
	if to-from+1 > l.maxBlocks {
		l.mu.Lock()
		l.refusedSpan++
		l.mu.Unlock()
		return fmt.Errorf("Log response size exceeded. You can make eth_getLogs requests with up to a %d block range. Based on your parameters, this block range should work: [%#x, %#x]",
			l.maxBlocks, from, from+l.maxBlocks-1)
	}
	var raw json.RawMessage
	if err := l.Chain.CallContext(ctx, &raw, method, args...); err != nil {
		return err
	}
	var logs []json.RawMessage
	if err := json.Unmarshal(raw, &logs); err != nil {
		return err
	}
	if len(logs) > l.maxLogs {
		l.mu.Lock()
		l.refusedLogs++
		l.mu.Unlock()
		return fmt.Errorf("query returned more than %d results", l.maxLogs)
	}
	l.mu.Lock()
	l.largest = max(l.largest, to-from+1)
	l.mu.Unlock()
	return json.Unmarshal(raw, result)
}

// BatchCallContext applies the limits to the batch's eth_getLogs elements, each answered on its
// own (as a provider answers a batch's elements).
func (l *rangeLimiter) BatchCallContext(ctx context.Context, b []rpc.BatchElem) error {
	for i := range b {
		b[i].Error = l.CallContext(ctx, b[i].Result, b[i].Method, b[i].Args...)
	}
	return nil
}

// TestLiveRangeRespectsProviderLimits: the blocks above the backfill (the unfinalized window, up to
// 128 blocks here, which is also where a restarted indexer lands after a short stop) must be read
// in ranges the provider accepts, like the backfill's.
func TestLiveRangeRespectsProviderLimits(t *testing.T) {
	cfg := freshConfig(t)
	network := cfg.Network
	sender := gasAccount(t)
	for i := range 5 {
		payOnce(t, chain.Accounts[8], sender, int64(1+i))
		mine(t, 20)
	}
	top := head(t)
	limiter := &rangeLimiter{Chain: chain.RPC, maxBlocks: 20, maxLogs: 1_000_000}
	cfg.Chain = limiter
	r := start(t, cfg)
	r.waitCursor(t, top, 10*time.Second)
	c := compareWithChain(t, network, cfg.Tokens, cfg.StartBlock, top)
	if c.used != 5 {
		t.Errorf("indexed %+v, want 5 authorizations", c)
	}
}
