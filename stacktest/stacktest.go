// Package stacktest is the one test bench of the repository's integration tests: an anvil with
// Circle's USDC and a database per test binary (under CI=true a missing anvil, node_modules or
// TEST_DATABASE_URL fails the run; elsewhere the package is skipped with a message), signed payments
// as the official client sends them, settle engines that a test can stop to play a process that
// died, an indexer, the facilitator's HTTP API over real services, readers of the chain and the
// ledger, and a WebSocket proxy a test can break. Only _test.go files import it.
//
// A package's tests do not run in parallel with each other: they share the chain (some switch its
// mining off or move its clock) and the index's one cursor per network.
package stacktest

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// Env is one test binary's chain and, unless its Options say none, database, with the chain's
// network bound in the ledger.
type Env struct {
	Chain *devchain.Chain
	DBURL string
	DB    *postgres.DB  // open for the whole run
	Pool  *pgxpool.Pool // reads the ledger's and the index's tables directly

	v1Name  string
	mu      sync.Mutex
	ledgers map[string]*ledgerSetup
}

// Options shape a test binary's bench.
type Options struct {
	// DB is the suffix of the binary's database, "<TEST_DATABASE_URL's>_<DB>"; "" for none (a
	// test can still ask for one: Ledger).
	DB string
	// Chain is the anvil's options (a chain id of its own, say).
	Chain devchain.Options
	// V1Name is the v1 network name Network carries ("" for none).
	V1Name string
}

// Main is for a package's TestMain: MainWith with the database named name.
func Main(m *testing.M, name string, run func(*Env) int) {
	MainWith(m, Options{DB: name}, func(e *Env) (int, error) { return run(e), nil })
}

// MainWith is for a package's TestMain: it starts the chain, creates and migrates the database
// (if o names one) and binds the chain's network in it, and calls run (which sets up whatever else
// the package needs and returns m.Run()'s code) before tearing all of it down. An error from the
// set-up, run's included, counts as a missing dependency.
func MainWith(m *testing.M, o Options, run func(*Env) (int, error)) {
	mainChain(m, o.Chain, func(c *devchain.Chain) (int, error) {
		env := &Env{Chain: c, v1Name: o.V1Name}
		if o.DB == "" {
			return run(env)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u, err := FreshDB(ctx, o.DB)
		if err != nil {
			return 0, err
		}
		env.DBURL = u
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
		if err := env.bind(ctx, env.DB); err != nil {
			return 0, err
		}
		return run(env)
	})
}

// bind binds the chain's network in db.
func (e *Env) bind(ctx context.Context, db *postgres.DB) error {
	genesis, err := e.Chain.Client.HeaderByNumber(ctx, big.NewInt(0))
	if err != nil {
		return err
	}
	return db.BindNetwork(ctx, e.Network().ID, e.Chain.ChainID, genesis.Hash())
}

type ledgerSetup struct {
	once sync.Once
	url  string
	err  error
}

// Ledger is the URL of the migrated database "<TEST_DATABASE_URL's>_<name>" with the chain's
// network bound, created on the run's first call with that name and shared by the tests that name
// it: tests that must not see the others' settlements (webhooks hear every settlement of their
// database) name one of their own. Without TEST_DATABASE_URL the test fails under CI=true and is
// skipped elsewhere.
func (e *Env) Ledger(t testing.TB, name string) string {
	t.Helper()
	e.mu.Lock()
	if e.ledgers == nil {
		e.ledgers = map[string]*ledgerSetup{}
	}
	l := e.ledgers[name]
	if l == nil {
		l = &ledgerSetup{}
		e.ledgers[name] = l
	}
	e.mu.Unlock()
	l.once.Do(func() { l.url, l.err = e.setUpLedger(name) })
	if errors.Is(l.err, ErrNoDatabase) {
		missing(t, "these tests need Postgres: %v", l.err)
	}
	if l.err != nil {
		t.Fatalf("setting up the database %s: %v", name, l.err)
	}
	return l.url
}

func (e *Env) setUpLedger(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := FreshDB(ctx, name)
	if err != nil {
		return "", err
	}
	db, err := postgres.Open(ctx, u, nil)
	if err != nil {
		return "", err
	}
	defer db.Close()
	if _, err := db.Migrate(ctx); err != nil {
		return "", err
	}
	return u, e.bind(ctx, db)
}

// Network is the chain's network with its USDC.
func (e *Env) Network() facilitator.Network {
	c := e.Chain
	return facilitator.Network{ID: facilitator.CAIP2(c.ChainID), ChainID: c.ChainID, V1Name: e.v1Name,
		Tokens: []facilitator.Token{{Address: c.USDC.Address, Name: c.USDC.Name, Version: c.USDC.Version, Decimals: 6}}}
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
