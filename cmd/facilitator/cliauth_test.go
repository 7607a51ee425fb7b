package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// settledStatus answers every transaction lookup with one final settlement: the test is about
// getting through the key check, not about the ledger behind it.
type settledStatus struct{}

func (settledStatus) Authorization(context.Context, facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	return facilitator.AuthorizationStatus{}, false, facilitator.ErrNotFound
}

func (settledStatus) Payment(context.Context, string, string) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
}

func (settledStatus) Settlement(context.Context, common.Hash) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{State: "final"}, nil
}

// Public answers the public view: one settlement of ours, as an agent without a key reads it.
func (settledStatus) Public(_ context.Context, k facilitator.AuthorizationKey) (facilitator.Receipt, bool, error) {
	return facilitator.Receipt{View: facilitator.ViewPublic, State: facilitator.StatusSettled, SettledBy: "facilitator", Network: k.Network,
		Asset: k.Asset.Hex(), Authorizer: k.Payer.Hex(), Nonce: "0x" + common.Bytes2Hex(k.Nonce[:]), Transaction: "0x" + strings.Repeat("cd", 32),
		BlockNumber: 7, Confirmations: 2, Basis: "ledger", Head: 8}, true, nil
}

func (settledStatus) PublicSettlement(context.Context, common.Hash) (facilitator.Receipt, error) {
	return facilitator.Receipt{}, facilitator.ErrNotFound
}

// keyedAPI serves the API in keys mode over a real key table (made with `facilitator keys
// create`), and returns its URL and the text of a key with scopes; public: with public receipts
// (serve's default), else as --public-receipts=false.
func keyedAPI(t *testing.T, scopes string, public bool) (base, key, dbURL string) {
	t.Helper()
	dbURL = stacktest.NewDB(t, "opcli_auth")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := openDB(ctx, dbURL, newLogger(&bytes.Buffer{}, "warn", "text"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	env := func(k string) string { return map[string]string{"DATABASE_URL": dbURL}[k] }
	if code := run(ctx, []string{"keys", "create", "--name", "ops", "--scopes", scopes}, env, &out, &errs); code != 0 {
		t.Fatalf("keys create: %d %s", code, errs.String())
	}
	key = regexp.MustCompile(`x402_\S+`).FindString(out.String())
	if key == "" {
		t.Fatalf("keys create printed no key: %s", out.String())
	}
	cfg := api.Config{Status: settledStatus{}, Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: db}}
	if public {
		cfg.Receipts = settledStatus{}
	}
	srv := api.New(cfg)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL, key, dbURL
}

// TestStatusAPIKey: under --auth keys (serve's default; public receipts off, so that every lookup
// needs the key) `facilitator status` sends a key given by --api-key or FACILITATOR_API_KEY, and
// says how to give one when it is refused; the key never shows in its output, its errors or its -h.
func TestStatusAPIKey(t *testing.T) {
	base, key, _ := keyedAPI(t, "status", false)
	tx := "0x" + strings.Repeat("ab", 32)
	status := func(env map[string]string, args ...string) (int, string) {
		var out, errs bytes.Buffer
		code := run(t.Context(), append([]string{"status", "--url", base}, args...), func(k string) string { return env[k] }, &out, &errs)
		return code, out.String() + errs.String()
	}

	code, out := status(nil, "tx", tx)
	if code != 1 || !strings.Contains(out, "401") || !strings.Contains(out, "--api-key") || !strings.Contains(out, "FACILITATOR_API_KEY") {
		t.Fatalf("without a key: exit %d, want 1 and a 401 saying how to give a key:\n%s", code, out)
	}
	for name, run := range map[string]func() (int, string){
		"flag": func() (int, string) { return status(nil, "--api-key", key, "tx", tx) },
		"env":  func() (int, string) { return status(map[string]string{"FACILITATOR_API_KEY": key}, "tx", tx) },
		// The flag wins over the variable, as every other flag does.
		"flag over env": func() (int, string) {
			return status(map[string]string{"FACILITATOR_API_KEY": "x402_000000000000_wrong"}, "--api-key", key, "tx", tx)
		},
	} {
		code, out := run()
		if code != 0 || !strings.Contains(out, "final") {
			t.Errorf("%s: exit %d, want 0 and the settlement:\n%s", name, code, out)
		}
		if strings.Contains(out, key) {
			t.Errorf("%s: the output shows the key:\n%s", name, out)
		}
	}

	wrong := key[:len(key)-4] + "0000"
	code, out = status(nil, "--api-key", wrong, "tx", tx)
	if code != 1 || !strings.Contains(out, "401") || strings.Contains(out, wrong) || strings.Contains(out, key[len(key)-10:]) {
		t.Errorf("a wrong key: exit %d, want 1 and a 401 without the key:\n%s", code, out)
	}
	code, out = status(map[string]string{"FACILITATOR_API_KEY": key}, "-h")
	if code != 0 || !strings.Contains(out, "-api-key") || strings.Contains(out, key) {
		t.Errorf("-h: exit %d, want 0, the flag, and not the key from the environment:\n%s", code, out)
	}
}

// TestStatusWithoutKey: under --auth keys, `facilitator status authorization` with no key at all
// reads the public view (the agent's side of the recovery recipe) and says it is the public view;
// a payment id lookup still needs a key, and says how to give one.
func TestStatusWithoutKey(t *testing.T) {
	base, _, _ := keyedAPI(t, "status", true)
	var out, errs bytes.Buffer
	args := []string{"status", "--url", base, "authorization", "eip155:8453", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
		"0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "0x" + strings.Repeat("11", 32)}
	if code := run(t.Context(), args, func(string) string { return "" }, &out, &errs); code != 0 {
		t.Fatalf("without a key: exit %d:\n%s%s", code, out.String(), errs.String())
	}
	for _, want := range []string{"settled (by facilitator)", "0x" + strings.Repeat("cd", 32), "view          public (no API key)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the public view's print lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	errs.Reset()
	code := run(t.Context(), []string{"status", "--url", base, "payment", "order-1234567890abcdef"}, func(string) string { return "" }, &out, &errs)
	if code != 1 || !strings.Contains(errs.String(), "401") || !strings.Contains(errs.String(), "--api-key") {
		t.Errorf("a payment id without a key: exit %d, want 1 and the key hint:\n%s%s", code, out.String(), errs.String())
	}
}
