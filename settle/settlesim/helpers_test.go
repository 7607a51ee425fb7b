package settlesim

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

var (
	gwei  = big.NewInt(1_000_000_000)
	start = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
)

// world is a chain with one funded signer key (ours) and one payer holding tokens.
type world struct {
	t      *testing.T
	clock  *Clock
	chain  *Chain
	node   *Backend // a reliable node at the head
	signer *ecdsa.PrivateKey
	addr   common.Address
	payer  common.Address
	payTo  common.Address
	rng    *rand.Rand
}

func newWorld(t *testing.T, cfg ChainConfig) *world {
	t.Helper()
	clock := NewClock(start)
	c := NewChain(cfg, clock)
	rng := rand.New(rand.NewPCG(1, 2))
	w := &world{t: t, clock: clock, chain: c, rng: rng, signer: key(t, "signer"),
		payer: crypto.PubkeyToAddress(key(t, "payer").PublicKey), payTo: common.HexToAddress("0x00000000000000000000000000000000000000aa")}
	w.addr = crypto.PubkeyToAddress(w.signer.PublicKey)
	w.node = NewBackend(c, "node", Profile{}, rng)
	c.Fund(w.addr, new(big.Int).Mul(big.NewInt(10), big.NewInt(1e18)))
	c.Mint(w.payer, big.NewInt(1_000_000))
	return w
}

func key(t testing.TB, name string) *ecdsa.PrivateKey {
	k, err := crypto.ToECDSA(crypto.Keccak256([]byte("settlesim test " + name)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// auth is an authorization from the payer of value, valid for an hour from the clock.
func (w *world) auth(nonce byte, value int64) facilitator.Authorization {
	return facilitator.Authorization{From: w.payer, To: w.payTo, Value: big.NewInt(value), ValidAfter: big.NewInt(0),
		ValidBefore: big.NewInt(w.clock.Now().Unix() + 3600), Nonce: [32]byte{nonce}}
}

// calldata is the engine's transferWithAuthorization for a: the (v, r, s) overload.
func calldata(a facilitator.Authorization) []byte {
	sig := make([]byte, 65)
	sig[0], sig[64] = 1, 27
	return eip3009.TransferCalldata(a, sig)
}

// sign signs a transaction of ours to the token, as the engine does.
func (w *world) sign(nonce uint64, data []byte, tip, feeCap *big.Int) *types.Transaction {
	w.t.Helper()
	return w.signWith(w.signer, w.chain.Config().ChainID, nonce, data, tip, feeCap, eip3009.GasLimit(96_000))
}

func (w *world) signWith(k *ecdsa.PrivateKey, chainID, nonce uint64, data []byte, tip, feeCap *big.Int, gas uint64) *types.Transaction {
	w.t.Helper()
	to := w.chain.Token()
	tx, err := types.SignNewTx(k, types.LatestSignerForChainID(new(big.Int).SetUint64(chainID)), &types.DynamicFeeTx{
		ChainID: new(big.Int).SetUint64(chainID), Nonce: nonce, GasTipCap: tip, GasFeeCap: feeCap, Gas: gas, To: &to, Data: data})
	if err != nil {
		w.t.Fatal(err)
	}
	return tx
}

// send broadcasts tx through b as the engine does.
func send(b interface {
	CallContext(context.Context, any, string, ...any) error
}, tx *types.Transaction) error {
	raw, err := tx.MarshalBinary()
	if err != nil {
		return err
	}
	var h common.Hash
	err = b.CallContext(context.Background(), &h, "eth_sendRawTransaction", hexutil.Bytes(raw))
	if err == nil && h != tx.Hash() {
		return errors.New("eth_sendRawTransaction answered another hash")
	}
	return err
}

func (w *world) mustSend(tx *types.Transaction) {
	w.t.Helper()
	if err := send(w.node, tx); err != nil {
		w.t.Fatalf("send %s: %v", tx.Hash(), err)
	}
}

// receipt reads a receipt as the watcher does: into a **types.Receipt.
func receipt(t *testing.T, b *Backend, h common.Hash) *types.Receipt {
	t.Helper()
	var r *types.Receipt
	if err := b.CallContext(context.Background(), &r, "eth_getTransactionReceipt", h); err != nil {
		t.Fatalf("receipt %s: %v", h, err)
	}
	return r
}

func authorizationUsed(t *testing.T, b *Backend, token, payer common.Address, nonce [32]byte, at any) bool {
	t.Helper()
	var state hexutil.Bytes
	call := map[string]any{"to": token, "input": hexutil.Bytes(eip3009.AuthorizationStateCalldata(payer, nonce))}
	if err := b.CallContext(context.Background(), &state, "eth_call", call, at); err != nil {
		t.Fatalf("authorizationState: %v", err)
	}
	used, ok := eip3009.DecodeAuthorizationState(state)
	if !ok {
		t.Fatalf("authorizationState answered %x", []byte(state))
	}
	return used
}

// wantRPCError checks that err is a node's error object (an rpc.Error) whose message contains want.
func wantRPCError(t *testing.T, err error, want string) {
	t.Helper()
	var re rpc.Error
	if !errors.As(err, &re) {
		t.Fatalf("error %v (%T) is not an rpc.Error; want %q", err, err, want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q, want %q", err, want)
	}
}
