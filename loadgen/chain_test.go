package loadgen

import (
	"context"
	"errors"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// strandingPool is anvil 1.7.1's auto-mining pool with the fault that a loaded machine produces
// and a real anvil cannot be made to produce on demand: one transaction, on its first arrival,
// lands in "queued" and stays there after its predecessor is mined, so evm_mine skips it and a
// resend is refused as already imported. Emptying the pool clears it.
type strandingPool struct {
	mu       sync.Mutex
	mined    uint64            // the sender's mined nonce
	pool     map[uint64][]byte // nonce -> raw transaction
	strand   uint64            // the nonce that strands
	stranded bool              // it is in the pool and stuck
	used     bool              // it has stranded once
	drops    int
}

// mine includes every consecutive ready transaction, as auto-mine and evm_mine do.
func (p *strandingPool) mine() {
	for {
		if _, ok := p.pool[p.mined]; !ok || (p.stranded && p.mined == p.strand) {
			return
		}
		delete(p.pool, p.mined)
		p.mined++
	}
}

type fakeEth struct{ p *strandingPool }

func (f fakeEth) GetTransactionCount(_ common.Address, _ string) hexutil.Uint64 {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return hexutil.Uint64(f.p.mined)
}

func (f fakeEth) SendRawTransaction(raw hexutil.Bytes) (common.Hash, error) {
	var tx types.Transaction
	if err := tx.UnmarshalBinary(raw); err != nil {
		return common.Hash{}, err
	}
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	switch _, known := f.p.pool[tx.Nonce()]; {
	case tx.Nonce() < f.p.mined:
		return common.Hash{}, errors.New("nonce too low")
	case known:
		return common.Hash{}, errors.New("transaction already imported")
	}
	f.p.pool[tx.Nonce()] = raw
	if tx.Nonce() == f.p.strand && !f.p.used {
		f.p.stranded, f.p.used = true, true
	}
	f.p.mine()
	return tx.Hash(), nil
}

type fakeEVM struct{ p *strandingPool }

func (f fakeEVM) Mine() {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	f.p.mine()
}

type fakeAnvil struct{ p *strandingPool }

func (f fakeAnvil) DropAllTransactions() {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	f.p.pool = map[uint64][]byte{}
	f.p.stranded = false
	f.p.drops++
}

// TestCeilingRecoversAStrandedTransaction: the ceiling phase that failed a CI run ("1 of 20 mined:
// context deadline exceeded", nudge after nudge) finishes when anvil strands a transaction.
func TestCeilingRecoversAStrandedTransaction(t *testing.T) {
	p := &strandingPool{pool: map[uint64][]byte{}, strand: 3}
	srv := rpc.NewServer()
	for ns, svc := range map[string]any{"eth": fakeEth{p}, "evm": fakeEVM{p}, "anvil": fakeAnvil{p}} {
		if err := srv.RegisterName(ns, svc); err != nil {
			t.Fatal(err)
		}
	}
	defer srv.Stop()
	n := &node{c: rpc.DialInProc(srv), timeout: 5 * time.Second}

	key, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer := ethrpc.NewSigner(31337, key)
	to := common.HexToAddress("0x5")
	raws := make([]string, 8)
	for i := range raws {
		tx, err := signer.Sign(uint64(i), &to, nil, 21_000, big.NewInt(1), big.NewInt(2))
		if err != nil {
			t.Fatal(err)
		}
		b, err := tx.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		raws[i] = hexutil.Encode(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, nudges, err := runCeiling(ctx, n, crypto.PubkeyToAddress(key.PublicKey), raws, 1, 8, 4); err != nil {
		t.Fatalf("ceiling: %v (after %d nudges)", err, nudges)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mined != uint64(len(raws)) || p.drops != 1 {
		t.Fatalf("mined %d of %d with %d pool drops; want all with 1", p.mined, len(raws), p.drops)
	}
}
