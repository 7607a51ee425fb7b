// Package settletest is the shared test bench of the packages that settle real payments in their
// tests (settle, reconcile, status, paymentid, notify): one anvil with Circle's USDC and one
// database per test binary, signed payments as the official client sends them, settle engines that
// a test can stop to play a process that died, an indexer, and readers of the chain and the ledger.
//
// A package's tests do not run in parallel with each other: they share the chain (some switch its
// mining off or move its clock) and the index's one cursor per network.
package settletest

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/devchain/devchaintest"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres/postgrestest"
)

// Env is one test binary's chain and database, with the chain's network bound in the ledger.
type Env struct {
	Chain *devchain.Chain
	DBURL string
	DB    *postgres.DB  // open for the whole run
	Pool  *pgxpool.Pool // reads the ledger's and the index's tables directly
}

// Main is for a package's TestMain: it starts the chain (devchaintest's rules for a missing anvil
// apply), creates and migrates the database "<TEST_DATABASE_URL's>_<name>", binds the chain's
// network, and calls run (which returns m.Run()'s code) before tearing all of it down.
func Main(m *testing.M, name string, run func(*Env) int) {
	devchaintest.Main(m, devchain.Options{}, func(c *devchain.Chain) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u, err := postgrestest.Fresh(ctx, name)
		if err != nil {
			return 0, err
		}
		env := &Env{Chain: c, DBURL: u}
		if env.DB, err = postgres.Open(ctx, u, nil); err != nil {
			return 0, err
		}
		defer env.DB.Close()
		if _, err := env.DB.Migrate(ctx); err != nil {
			return 0, err
		}
		if env.Pool, err = pgxpool.New(ctx, u); err != nil {
			return 0, err
		}
		defer env.Pool.Close()
		genesis, err := c.Client.HeaderByNumber(ctx, big.NewInt(0))
		if err != nil {
			return 0, err
		}
		if err := env.DB.BindNetwork(ctx, env.Network().ID, c.ChainID, genesis.Hash()); err != nil {
			return 0, err
		}
		return run(env), nil
	})
}

// Network is the chain's network with its USDC.
func (e *Env) Network() facilitator.Network {
	c := e.Chain
	return facilitator.Network{ID: facilitator.CAIP2(c.ChainID), ChainID: c.ChainID,
		Tokens: []facilitator.Token{{Address: c.USDC.Address, Name: c.USDC.Name, Version: c.USDC.Version}}}
}

// Reader is the verifier's view of the chain.
func (e *Env) Reader() *ethrpc.Reader {
	return &ethrpc.Reader{Chain: e.Chain.RPC, Timeout: 5 * time.Second}
}

// OpenDB is a ledger handle of the test's own (a process of its own), closed when the test ends.
func (e *Env) OpenDB(t testing.TB) *postgres.DB {
	t.Helper()
	db, err := postgres.Open(context.Background(), e.DBURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

// NewSigner is a fresh key holding ETH for gas, so tests never share a nonce stream.
func (e *Env) NewSigner(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Chain.SetBalance(context.Background(), AddressOf(k), new(big.Int).Mul(big.NewInt(100), big.NewInt(1e18))); err != nil {
		t.Fatal(err)
	}
	return k
}

// FundedPayer is a fresh key holding usdc atomic units of USDC (no ETH: payers never pay gas).
func (e *Env) FundedPayer(t testing.TB, usdc int64) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Chain.USDC.Mint(context.Background(), AddressOf(k), big.NewInt(usdc)); err != nil {
		t.Fatal(err)
	}
	return k
}

// AddressOf is k's address.
func AddressOf(k *ecdsa.PrivateKey) common.Address { return crypto.PubkeyToAddress(k.PublicKey) }

// NewAddress is the address of a fresh key nobody keeps: a payTo no other test pays.
func NewAddress(t testing.TB) common.Address {
	t.Helper()
	k, err := crypto.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return AddressOf(k)
}

// Random32 is 32 random bytes: an authorization nonce.
func Random32(t testing.TB) [32]byte {
	t.Helper()
	var n [32]byte
	if _, err := rand.Read(n[:]); err != nil {
		t.Fatal(err)
	}
	return n
}

// RandomID is a fresh payment identifier, as a client makes one.
func RandomID(t testing.TB) string {
	t.Helper()
	n := Random32(t)
	return "pay_" + hex.EncodeToString(n[:12])
}
