package devchain

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"
)

// startChain starts a chain that is closed when the test ends.
func startChain(t *testing.T) *Chain {
	t.Helper()
	requireTools(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	begin := time.Now()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := Start(ctx, Options{Logger: log})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("Start took %s", time.Since(begin).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// requireTools skips when anvil/node_modules are missing, but fails under
// CI=true so CI can never go green by silently skipping.
func requireTools(t *testing.T) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := findNodeModules(wd); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("local chain tools missing under CI: %v", err)
		}
		t.Skipf("skipping, local chain tools missing (run `npm ci` in the module root): %v", err)
	}
}

func TestChain(t *testing.T) {
	c := startChain(t)
	ctx := t.Context()

	t.Run("usdc metadata", func(t *testing.T) {
		if c.USDC.Name != "USD Coin" || c.USDC.Version != "2" || c.USDC.Decimals != 6 {
			t.Fatalf("got name %q version %q decimals %d", c.USDC.Name, c.USDC.Version, c.USDC.Decimals)
		}
		if c.ChainID != DefaultChainID {
			t.Fatalf("chain id %d", c.ChainID)
		}
		ws, err := ethclient.DialContext(ctx, c.WSURL)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		if id, err := ws.ChainID(ctx); err != nil || id.Uint64() != c.ChainID {
			t.Fatalf("chain id over %s: %v %v", c.WSURL, id, err)
		}
	})

	t.Run("funded accounts", func(t *testing.T) {
		if len(c.Accounts) != 10 || c.Accounts[0].Address.Hex() != "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266" {
			t.Fatalf("unexpected accounts: %d, first %s", len(c.Accounts), c.Accounts[0].Address)
		}
		bal, err := c.USDC.BalanceOf(ctx, c.Accounts[0].Address)
		if err != nil {
			t.Fatal(err)
		}
		if bal.Cmp(InitialUSDC()) != 0 {
			t.Fatalf("balance of account 0 = %s, want %s", bal, InitialUSDC())
		}
	})

	t.Run("multicall3", func(t *testing.T) {
		code, err := c.Client.CodeAt(ctx, c.Multicall3, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(code) == 0 {
			t.Fatalf("no code at %s", c.Multicall3)
		}
	})

	t.Run("smart wallet", func(t *testing.T) {
		owner, stranger := c.Accounts[2], c.Accounts[3]
		wallet, err := c.DeploySmartWallet(ctx, owner.Address)
		if err != nil {
			t.Fatal(err)
		}
		hash := crypto.Keccak256Hash([]byte("x402 devchain"))
		for _, tc := range []struct {
			name string
			sig  func() []byte
			want uint32
		}{
			{"owner", func() []byte { return mustSign(t, hash[:], owner) }, ERC1271Magic},
			{"owner v 0/1", func() []byte { s := mustSign(t, hash[:], owner); s[64] -= 27; return s }, ERC1271Magic},
			{"stranger", func() []byte { return mustSign(t, hash[:], stranger) }, 0xffffffff},
			{"short", func() []byte { return []byte{1, 2, 3} }, 0xffffffff},
		} {
			got, err := c.IsValidSignature(ctx, wallet, hash, tc.sig())
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got != tc.want {
				t.Errorf("%s: isValidSignature = %#x, want %#x", tc.name, got, tc.want)
			}
		}
	})

	t.Run("transferWithAuthorization", func(t *testing.T) {
		payer, payee, facilitator := c.Accounts[1], c.Accounts[4], c.Accounts[5]
		var nonce [32]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			t.Fatal(err)
		}
		auth := TransferAuthorization{
			From:        payer.Address,
			To:          payee.Address,
			Value:       big.NewInt(1_234_567),
			ValidAfter:  big.NewInt(0),
			ValidBefore: big.NewInt(time.Now().Add(time.Hour).Unix()),
			Nonce:       nonce,
		}
		sig, err := c.USDC.SignTransferAuthorization(payer.Key, auth)
		if err != nil {
			t.Fatal(err)
		}
		before := balances(t, c, auth)
		hash, err := c.USDC.TransferWithAuthorization(ctx, facilitator, auth.From, auth.To, auth.Value, auth.ValidAfter, auth.ValidBefore, auth.Nonce, sig)
		if err != nil {
			t.Fatal(err)
		}
		after := balances(t, c, auth)
		if d := new(big.Int).Sub(before[0], after[0]); d.Cmp(auth.Value) != 0 {
			t.Errorf("payer lost %s, want %s", d, auth.Value)
		}
		if d := new(big.Int).Sub(after[1], before[1]); d.Cmp(auth.Value) != 0 {
			t.Errorf("payee gained %s, want %s", d, auth.Value)
		}
		used, err := c.USDC.AuthorizationState(ctx, payer.Address, nonce)
		if err != nil {
			t.Fatal(err)
		}
		if !used {
			t.Error("authorizationState is false after the transfer")
		}
		rcpt, err := c.Client.TransactionReceipt(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("transferWithAuthorization (v,r,s) gas used: %d", rcpt.GasUsed)

		// Replaying the same nonce must revert; the error must surface.
		if _, err := c.USDC.TransferWithAuthorization(ctx, facilitator, auth.From, auth.To, auth.Value, auth.ValidAfter, auth.ValidBefore, auth.Nonce, sig); err == nil {
			t.Error("replay succeeded")
		}
	})

	t.Run("smart wallet pays via bytes overload", func(t *testing.T) {
		owner := c.Accounts[6]
		wallet, err := c.DeploySmartWallet(ctx, owner.Address)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.USDC.Mint(ctx, wallet, big.NewInt(5_000_000)); err != nil {
			t.Fatal(err)
		}
		auth := TransferAuthorization{From: wallet, To: c.Accounts[7].Address, Value: big.NewInt(2_000_000),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Add(time.Hour).Unix()), Nonce: [32]byte{1}}
		sig, err := c.USDC.SignTransferAuthorization(owner.Key, auth)
		if err != nil {
			t.Fatal(err)
		}
		// Any length but 65 takes the `bytes signature` overload; the wallet only
		// accepts exactly 65 bytes, so this must revert (with USDC's reason).
		_, err = c.USDC.TransferWithAuthorization(ctx, c.Accounts[5], auth.From, auth.To, auth.Value, auth.ValidAfter, auth.ValidBefore, auth.Nonce, append(bytes.Clone(sig), 0))
		if err == nil {
			t.Fatal("66-byte signature accepted")
		}
		t.Logf("66-byte signature: %v", err)
		// A 65-byte signature through the bytes overload, as x402 settles contract
		// wallets; TransferWithAuthorization would pick (v,r,s) for 65 bytes.
		method := c.USDC.overload("transferWithAuthorization", 7)
		rcpt, err := c.transact(ctx, c.Accounts[5], c.USDC.Address, &c.USDC.ABI, method,
			auth.From, auth.To, auth.Value, auth.ValidAfter, auth.ValidBefore, auth.Nonce, sig)
		if err != nil {
			t.Fatal(err)
		}
		bal, err := c.USDC.BalanceOf(ctx, wallet)
		if err != nil {
			t.Fatal(err)
		}
		if bal.Cmp(big.NewInt(3_000_000)) != 0 {
			t.Errorf("wallet balance %s, want 3000000", bal)
		}
		t.Logf("transferWithAuthorization(bytes) from ERC-1271 wallet gas used: %d", rcpt.GasUsed)
	})

	t.Run("blacklist", func(t *testing.T) {
		victim := c.Accounts[8]
		if err := c.USDC.Blacklist(ctx, victim.Address); err != nil {
			t.Fatal(err)
		}
		auth := TransferAuthorization{From: victim.Address, To: c.Accounts[9].Address, Value: big.NewInt(1),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(time.Now().Add(time.Hour).Unix()), Nonce: [32]byte{2}}
		sig, err := c.USDC.SignTransferAuthorization(victim.Key, auth)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.USDC.TransferWithAuthorization(ctx, c.Accounts[5], auth.From, auth.To, auth.Value, auth.ValidAfter, auth.ValidBefore, auth.Nonce, sig)
		if err == nil {
			t.Fatal("blacklisted payer could transfer")
		}
		t.Logf("blacklisted transfer error: %v", err)
		if err := c.USDC.Unblacklist(ctx, victim.Address); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("time and snapshots", func(t *testing.T) {
		head, err := c.Client.HeaderByNumber(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := c.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.IncreaseTime(ctx, 3600); err != nil {
			t.Fatal(err)
		}
		later, err := c.Client.HeaderByNumber(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if later.Time < head.Time+3600 {
			t.Errorf("time moved from %d to %d, want +3600", head.Time, later.Time)
		}
		if err := c.Revert(ctx, snap); err != nil {
			t.Fatal(err)
		}
		back, err := c.Client.BlockNumber(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if back != head.Number.Uint64() {
			t.Errorf("after revert at block %d, want %d", back, head.Number)
		}
	})
}

func TestCloseKillsAnvil(t *testing.T) {
	c := startChain(t)
	pid := c.proc.cmd.Process.Pid
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.tmpDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s still there: %v", c.tmpDir, err)
	}
	if _, err := c.Client.ChainID(context.Background()); err == nil {
		t.Error("RPC still answers after Close")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("anvil pid %d still exists", pid)
	}
}

// TestBlockTime covers interval mining: set-up batches and receipt polling must
// cope with transactions that wait for the next block.
func TestBlockTime(t *testing.T) {
	requireTools(t)
	begin := time.Now()
	c, err := Start(t.Context(), Options{BlockTime: 200 * time.Millisecond, ChainID: 8453})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("Start with 200ms blocks took %s", time.Since(begin).Round(time.Millisecond))
	if c.ChainID != 8453 {
		t.Fatalf("chain id %d", c.ChainID)
	}
	bal, err := c.USDC.BalanceOf(t.Context(), c.Accounts[9].Address)
	if err != nil || bal.Cmp(InitialUSDC()) != 0 {
		t.Fatalf("balance %v %v", bal, err)
	}
}

func TestMissingNodeModules(t *testing.T) {
	_, err := Start(t.Context(), Options{NodeModules: t.TempDir()})
	if err == nil {
		t.Fatal("Start succeeded without anvil")
	}
	t.Log(err)
}

func balances(t *testing.T, c *Chain, a TransferAuthorization) [2]*big.Int {
	t.Helper()
	from, err := c.USDC.BalanceOf(t.Context(), a.From)
	if err != nil {
		t.Fatal(err)
	}
	to, err := c.USDC.BalanceOf(t.Context(), a.To)
	if err != nil {
		t.Fatal(err)
	}
	return [2]*big.Int{from, to}
}

func mustSign(t *testing.T, hash []byte, a *Account) []byte {
	t.Helper()
	sig, err := crypto.Sign(hash, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	return sig
}
