package settle_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/devchain/devchaintest"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres/postgrestest"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// The package's tests share one anvil with real USDC and one database of their own.
var (
	chain *devchain.Chain
	dbURL string
)

func TestMain(m *testing.M) {
	devchaintest.Main(m, devchain.Options{}, func(c *devchain.Chain) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u, err := postgrestest.Fresh(ctx, "settle")
		if err != nil {
			return 0, err
		}
		chain, dbURL = c, u
		db, err := postgres.Open(ctx, dbURL, nil)
		if err != nil {
			return 0, err
		}
		defer db.Close()
		if _, err := db.Migrate(ctx); err != nil {
			return 0, err
		}
		genesis, err := c.Client.HeaderByNumber(ctx, big.NewInt(0))
		if err != nil {
			return 0, err
		}
		if err := db.BindNetwork(ctx, network().ID, c.ChainID, genesis.Hash()); err != nil {
			return 0, err
		}
		return m.Run(), nil
	})
}

func network() facilitator.Network {
	return facilitator.Network{ID: facilitator.CAIP2(chain.ChainID), ChainID: chain.ChainID,
		Tokens: []facilitator.Token{{Address: chain.USDC.Address, Name: chain.USDC.Name, Version: chain.USDC.Version}}}
}

// rig is one engine over the shared chain and database.
type rig struct {
	engine  *settle.Engine
	db      *postgres.DB
	signers []*ecdsa.PrivateKey
}

type rigOptions struct {
	signers  []*ecdsa.PrivateKey // default: one fresh funded key
	deadline time.Duration
	cfg      func(*settle.Config)
}

// newSigner is a fresh key holding ETH for gas, so tests never share a nonce stream.
func newSigner(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	eth := new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18))
	if err := chain.SetBalance(context.Background(), crypto.PubkeyToAddress(k.PublicKey), eth); err != nil {
		t.Fatal(err)
	}
	return k
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	ctx := context.Background()
	db, err := postgres.Open(ctx, dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if o.signers == nil {
		o.signers = []*ecdsa.PrivateKey{newSigner(t)}
	}
	n := network()
	v, err := verify.New(verify.Config{Networks: []facilitator.Network{n},
		Readers: map[string]verify.Reader{n.ID: &verify.RPCReader{Client: chain.RPC, Timeout: 5 * time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := settle.Config{
		Networks:     []settle.NetworkConfig{{Network: n, Chain: chain.RPC, Signers: o.signers, FinalityDepth: 1}},
		Store:        db,
		Verifier:     v,
		Deadline:     o.deadline,
		PollInterval: pollInterval,
		Logger:       testLogger(t),
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = 20 * time.Second
	}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	e, err := settle.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return &rig{engine: e, db: db, signers: o.signers}
}

// pay is a signed payment of value from a payer (a dev account, or any key with USDC) to payTo.
type pay struct {
	payer *ecdsa.PrivateKey
	payTo common.Address
	value int64
	nonce [32]byte
}

func newPay(t testing.TB, payer *ecdsa.PrivateKey, value int64) pay {
	t.Helper()
	var n [32]byte
	if _, err := rand.Read(n[:]); err != nil {
		t.Fatal(err)
	}
	k, _ := crypto.GenerateKey()
	return pay{payer: payer, payTo: crypto.PubkeyToAddress(k.PublicKey), value: value, nonce: n}
}

// body is the /settle request for p, as the official client and resource server send it.
func (p pay) body(t testing.TB) []byte {
	t.Helper()
	from := crypto.PubkeyToAddress(p.payer.PublicKey)
	validBefore := time.Now().Unix() + 3600
	a := devchain.TransferAuthorization{From: from, To: p.payTo, Value: big.NewInt(p.value), ValidAfter: big.NewInt(0),
		ValidBefore: big.NewInt(validBefore), Nonce: p.nonce}
	sig, err := chain.USDC.SignTransferAuthorization(p.payer, a)
	if err != nil {
		t.Fatal(err)
	}
	reqs := map[string]any{"scheme": "exact", "network": network().ID, "amount": big.NewInt(p.value).String(),
		"asset": chain.USDC.Address.Hex(), "payTo": p.payTo.Hex(), "maxTimeoutSeconds": 3600,
		"extra": map[string]any{"name": chain.USDC.Name, "version": chain.USDC.Version}}
	body, err := json.Marshal(map[string]any{"x402Version": 2, "paymentRequirements": reqs, "paymentPayload": map[string]any{
		"x402Version": 2, "accepted": reqs, "resource": map[string]any{"url": "http://merchant.test/paid"},
		"payload": map[string]any{"signature": "0x" + hex.EncodeToString(sig), "authorization": map[string]any{
			"from": from.Hex(), "to": p.payTo.Hex(), "value": a.Value.String(), "validAfter": "0",
			"validBefore": a.ValidBefore.String(), "nonce": "0x" + hex.EncodeToString(p.nonce[:])}}}})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// settleBody decodes and settles one request body, as the API does.
func (r *rig) settleBody(ctx context.Context, t testing.TB, body []byte) (settle.Outcome, error) {
	p, err := facilitator.DecodeRequest(body)
	if err != nil {
		t.Fatalf("decoding: %v", err)
	}
	return r.engine.Settle(ctx, p)
}

func balance(t testing.TB, addr common.Address) *big.Int {
	t.Helper()
	b, err := chain.USDC.BalanceOf(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fundedPayer is a fresh key holding usdc atomic units of USDC (no ETH: payers never pay gas).
func fundedPayer(t testing.TB, usdc int64) *ecdsa.PrivateKey {
	t.Helper()
	k, _ := crypto.GenerateKey()
	if err := chain.USDC.Mint(context.Background(), crypto.PubkeyToAddress(k.PublicKey), big.NewInt(usdc)); err != nil {
		t.Fatal(err)
	}
	return k
}

var pollInterval = 50 * time.Millisecond
