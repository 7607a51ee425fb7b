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

// keyedAPI serves the API in keys mode over a real key table (made with `facilitator keys
// create`), and returns its URL and the text of a key with scopes.
func keyedAPI(t *testing.T, scopes string) (base, key, dbURL string) {
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
	srv := api.New(api.Config{Status: settledStatus{}, Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: db}})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL, key, dbURL
}

// TestStatusAPIKey: under --auth keys (serve's default) `facilitator status` sends a key given by
// --api-key or FACILITATOR_API_KEY, and says how to give one when it is refused; the key never
// shows in its output, its errors or its -h.
func TestStatusAPIKey(t *testing.T) {
	base, key, _ := keyedAPI(t, "status")
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
