package auth_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

func TestGenerateFormat(t *testing.T) {
	full, id, hash, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(full, "x402_"+id+"_") || len(full) != len("x402_")+12+1+64 || !auth.ValidID(id) {
		t.Fatalf("key %q (id %q) is not x402_<12 hex>_<64 hex>", full, id)
	}
	if got, ok := auth.ParseID(full); !ok || got != id {
		t.Fatalf("ParseID(%q) = %q, %v", full, got, ok)
	}
	if hash != auth.Hash(full) {
		t.Fatal("hash is not the key's SHA-256")
	}
	full2, id2, _, _ := auth.Generate()
	if full2 == full || id2 == id {
		t.Fatal("two keys are equal")
	}
	for _, bad := range []string{"", "x402_", full + "0", full[:len(full)-1], strings.ToUpper(full), "x402_" + id + "-" + full[18:], "y402" + full[4:], strings.Replace(full, full[5:6], "g", 1)} {
		if _, ok := auth.ParseID(bad); ok {
			t.Errorf("ParseID(%q) accepted", bad)
		}
	}
}

type store map[string]*facilitator.APIKey

func (s store) APIKey(_ context.Context, id string) (*facilitator.APIKey, error) {
	if k, ok := s[id]; ok {
		return k, nil
	}
	return nil, facilitator.ErrNotFound
}

type downStore struct{}

func (downStore) APIKey(context.Context, string) (*facilitator.APIKey, error) {
	return nil, errors.New("db down")
}

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	full, id, hash, _ := auth.Generate()
	revokedFull, revokedID, revokedHash, _ := auth.Generate()
	now := time.Now()
	s := store{id: {ID: id, Hash: hash, Scopes: []facilitator.Scope{facilitator.ScopeVerify}},
		revokedID: {ID: revokedID, Hash: revokedHash, Scopes: []facilitator.Scope{facilitator.ScopeVerify}, RevokedAt: &now}}
	k, err := auth.Authenticate(ctx, s, full, time.Now())
	if err != nil || k.ID != id {
		t.Fatalf("good key: %v %v", k, err)
	}
	last := full[len(full)-1]
	flipped := full[:len(full)-1] + map[bool]string{true: "1", false: "0"}[last == '0']
	other, _, _, _ := auth.Generate()
	for name, text := range map[string]string{"revoked": revokedFull, "wrong secret": flipped, "unknown": other, "malformed": "Bearer x", "empty": ""} {
		if _, err := auth.Authenticate(ctx, s, text, time.Now()); !errors.Is(err, auth.ErrUnauthorized) ||
			facilitator.ErrorCode(err) != facilitator.EUnauthenticated || facilitator.ErrorReason(err, "") != facilitator.ReasonUnauthorized {
			t.Errorf("%s: want an unauthenticated refusal wrapping ErrUnauthorized, got %v", name, err)
		}
	}
	if _, err := auth.Authenticate(ctx, downStore{}, full, time.Now()); err == nil || errors.Is(err, auth.ErrUnauthorized) ||
		facilitator.ErrorCode(err) != facilitator.EUnavailable {
		t.Fatalf("store down: want an unavailable store error, got %v", err)
	}
}

func TestScopes(t *testing.T) {
	got, err := auth.ParseScopes(" verify,settle ,verify,")
	if err != nil || len(got) != 2 || got[0] != facilitator.ScopeVerify || got[1] != facilitator.ScopeSettle {
		t.Fatalf("ParseScopes: %v %v", got, err)
	}
	for _, bad := range []string{"", ",", "verify,admin", "Verify"} {
		if _, err := auth.ParseScopes(bad); err == nil {
			t.Errorf("ParseScopes(%q) accepted", bad)
		}
	}
	k := &facilitator.APIKey{Scopes: got}
	if !k.Has(facilitator.ScopeSettle) || k.Has(facilitator.ScopeStatus) || k.Has(facilitator.ScopeWebhooks) {
		t.Fatalf("Has is wrong for %v", got)
	}
}

func TestPayToAllowList(t *testing.T) {
	a, b := common.HexToAddress("0x00000000000000000000000000000000000000aa"), common.HexToAddress("0x00000000000000000000000000000000000000bb")
	if !(&facilitator.APIKey{}).AllowsPayTo(a) {
		t.Fatal("an empty allow-list refuses")
	}
	list, err := auth.ParsePayTo("0x00000000000000000000000000000000000000AA, 0x00000000000000000000000000000000000000aa")
	if err != nil || len(list) != 1 {
		t.Fatalf("ParsePayTo: %v %v", list, err)
	}
	k := &facilitator.APIKey{PayTo: list}
	if !k.AllowsPayTo(a) || k.AllowsPayTo(b) {
		t.Fatal("allow-list is wrong")
	}
	for _, bad := range []string{"0x1234", "00000000000000000000000000000000000000aa", "nope"} {
		if _, err := auth.ParsePayTo(bad); err == nil {
			t.Errorf("ParsePayTo(%q) accepted", bad)
		}
	}
}

func TestLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := auth.NewLimiter(auth.Limit{Rate: 2, Burst: 3}, func() time.Time { return now })
	for i := 0; i < 3; i++ {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d refused within the burst", i)
		}
	}
	ok, wait := l.Allow("a")
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("past the burst: %v %v", ok, wait)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("buckets are not per name")
	}
	now = now.Add(time.Second)
	for i := 0; i < 2; i++ {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("refilled token %d refused", i)
		}
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("refilled beyond the rate")
	}
	var none *auth.Limiter = auth.NewLimiter(auth.Limit{}, nil)
	if ok, _ := none.Allow("a"); !ok {
		t.Fatal("a zero limit refuses")
	}
}

// TestAuthenticateRotated: a rotated key opens with its new secret always, with the secret the
// rotation replaced until the grace ends (at that instant it is refused), and GraceEnd tells which
// one was presented.
func TestAuthenticateRotated(t *testing.T) {
	ctx := context.Background()
	old, id, oldHash, _ := auth.Generate()
	fresh, freshHash, err := auth.NewSecret(id)
	if err != nil || fresh == old || !strings.HasPrefix(fresh, "x402_"+id+"_") || freshHash != auth.Hash(fresh) {
		t.Fatalf("NewSecret(%s) = %q, %v", id, fresh, err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	until := t0.Add(time.Hour)
	s := store{id: {ID: id, Hash: freshHash, Scopes: []facilitator.Scope{facilitator.ScopeVerify}, RotatedAt: &t0, PreviousHash: &oldHash, PreviousUntil: &until}}
	for _, c := range []struct {
		name string
		key  string
		at   time.Time
		ok   bool
	}{
		{"new secret in the grace", fresh, t0.Add(time.Minute), true},
		{"old secret in the grace", old, until.Add(-time.Nanosecond), true},
		{"old secret at the grace's end", old, until, false},
		{"old secret after the grace", old, until.Add(time.Hour), false},
		{"new secret after the grace", fresh, until.Add(time.Hour), true},
	} {
		k, err := auth.Authenticate(ctx, s, c.key, c.at)
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, auth.ErrUnauthorized)) || (c.ok && k.ID != id) {
			t.Errorf("%s: %+v, %v", c.name, k, err)
		}
	}
	if end, ok := auth.GraceEnd(s[id], old, t0); !ok || !end.Equal(until) {
		t.Errorf("GraceEnd(old) = %s, %v; want %s", end, ok, until)
	}
	if _, ok := auth.GraceEnd(s[id], fresh, t0); ok {
		t.Error("GraceEnd(new): the current secret has no grace")
	}
	// Rotated with no grace: the old secret is refused at once.
	s[id].PreviousHash, s[id].PreviousUntil = nil, nil
	if _, err := auth.Authenticate(ctx, s, old, t0); !errors.Is(err, auth.ErrUnauthorized) {
		t.Errorf("old secret without a grace: %v", err)
	}
}
