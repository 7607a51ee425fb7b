package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestKeysRotate: `keys rotate` gives a key a new secret under the same id, printed once and
// never to the log; the key keeps its scopes, pay-to and gas budget; the old secret opens it
// through the grace (read at a clock moved inside and past it) and not after; `keys list` shows the
// rotation; --grace 0 refuses the old secret and ends the key's console sessions at once; a
// revoked or unknown key is not rotated.
func TestKeysRotate(t *testing.T) {
	dbURL := stacktest.NewDB(t, "keysrotate")
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
	keysCmd := func(args ...string) (string, string, int) {
		t.Helper()
		var out, errs bytes.Buffer
		code := run(ctx, append([]string{"keys"}, args...), func(k string) string { return map[string]string{"DATABASE_URL": dbURL}[k] }, &out, &errs)
		return out.String(), errs.String(), code
	}
	keyText := regexp.MustCompile(`x402_[0-9a-f]{12}_[0-9a-f]{64}`)
	payTo := common.HexToAddress("0x00000000000000000000000000000000000000bb")
	out, errs, code := keysCmd("create", "--name", "shop", "--scopes", "verify,settle", "--pay-to", payTo.Hex(), "--gas-budget-wei", "12345")
	old := keyText.FindString(out)
	if code != 0 || old == "" {
		t.Fatalf("keys create: %d %s %s", code, out, errs)
	}
	id, _ := auth.ParseID(old)

	began := time.Now()
	out, errs, code = keysCmd("rotate", "--grace", "1h", id)
	fresh := keyText.FindString(out)
	if code != 0 || fresh == "" || fresh == old || !strings.HasPrefix(fresh, "x402_"+id+"_") {
		t.Fatalf("keys rotate: exit %d, want a new secret of key %s:\n%s%s", code, id, out, errs)
	}
	if strings.Count(out, fresh) != 1 || strings.Contains(errs, fresh) || !strings.Contains(out, "the old secret keeps working until ") {
		t.Fatalf("keys rotate printed the new secret other than once, or to stderr, or not the grace:\n%s\nstderr:\n%s", out, errs)
	}
	k, err := db.APIKey(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if auth.ScopesText(k.Scopes) != "verify,settle" || len(k.PayTo) != 1 || k.PayTo[0] != payTo || k.GasBudgetWei == nil || k.GasBudgetWei.Int64() != 12345 || k.Name != "shop" {
		t.Fatalf("the rotated key lost what it had: %+v", k)
	}
	for _, c := range []struct {
		name string
		key  string
		at   time.Duration // after the rotation
		ok   bool
	}{
		{"new secret", fresh, 0, true},
		{"old secret inside the grace", old, 30 * time.Minute, true},
		{"old secret past the grace", old, time.Hour + time.Minute, false},
		{"new secret past the grace", fresh, 2 * time.Hour, true},
	} {
		_, err := auth.Authenticate(ctx, db, c.key, began.Add(c.at))
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, auth.ErrUnauthorized)) {
			t.Errorf("%s, %s after the rotation: %v", c.name, c.at, err)
		}
	}
	out, _, code = keysCmd("list")
	if code != 0 || !strings.Contains(out, "ROTATED") || !regexp.MustCompile(id+`.*\d{4}-\d\d-\d\dT[^ ]+ \(old secret until \d{4}-`).MatchString(out) {
		t.Fatalf("keys list does not show the rotation:\n%s", out)
	}

	// A console session opened before a rotation without grace ends with it, and both old
	// secrets are refused at once.
	token, _, err := auth.OpenSession(ctx, db, k, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	out, _, code = keysCmd("rotate", "--grace", "0", id)
	newest := keyText.FindString(out)
	if code != 0 || newest == "" || !strings.Contains(out, "the old secret is refused from now on") {
		t.Fatalf("keys rotate --grace 0: %d\n%s", code, out)
	}
	now := time.Now().Add(time.Second)
	for name, key := range map[string]string{"first": old, "second": fresh} {
		if _, err := auth.Authenticate(ctx, db, key, now); !errors.Is(err, auth.ErrUnauthorized) {
			t.Errorf("the %s secret after a rotation without grace: %v", name, err)
		}
	}
	if _, err := auth.Authenticate(ctx, db, newest, now); err != nil {
		t.Errorf("the newest secret: %v", err)
	}
	if _, err := auth.ResolveSession(ctx, db, db, token, now); !errors.Is(err, auth.ErrUnauthorized) {
		t.Errorf("a console session opened before a rotation without grace: %v", err)
	}

	if _, errs, code := keysCmd("rotate", "--grace", "-1h", id); code == 0 || !strings.Contains(errs, "negative") {
		t.Errorf("a negative grace: %d %s", code, errs)
	}
	if _, errs, code := keysCmd("rotate", "000000000000"); code == 0 || !strings.Contains(errs, "no key 000000000000") {
		t.Errorf("an unknown key: %d %s", code, errs)
	}
	if _, errs, code := keysCmd("revoke", id); code != 0 {
		t.Fatal(errs)
	}
	if _, errs, code := keysCmd("rotate", id); code == 0 || !strings.Contains(errs, "is revoked") {
		t.Errorf("a revoked key: %d %s", code, errs)
	}
}
