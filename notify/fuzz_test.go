package notify

import (
	"context"
	"math"
	"math/big"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// These targets run in this package's test binary, whose TestMain needs anvil and Postgres
// (scripts/fuzz.sh provides both); the targets themselves touch neither.

// FuzzCheckURL: a webhook URL is refused with invalid_webhook and a message, or accepted as an
// absolute http(s) URL of at most 2048 characters, with a host and no credentials; refusing
// private targets, its host (parsed again from what is stored, as the delivery client will) is a
// name or a public address. The stored form is a fixed point, and what the strict check accepts
// the lax one accepts the same.
func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{
		"https://merchant.example/hooks/x402?token=abc", "http://merchant.example:8080/", "https://8.8.8.8/hook",
		"", "ftp://merchant.example/", "merchant.example/hook", "https:///path", "https://user:pass@merchant.example/",
		"http://127.0.0.1:9000/", "http://localhost/", "http://api.localhost./", "http://LOCALHOST/", "http://10.1.2.3/",
		"http://169.254.169.254/latest/meta-data", "http://[::1]/", "http://[fd00::1]/", "http://100.100.100.200/",
		"http://[::ffff:10.0.0.1]/", "http://0.0.0.0/", "%zz", "http://0x7f000001/", "http://2130706433/", "http://127.1/",
		"http://[fe80::1%25en0]/", "http://[::ffff:7f00:1]/", "HTTP://merchant.example/", "http://merchant.example:99999/",
		"http://merchant.example/\x00", "http://merch\u00e4nt.example/", "http://\xff.example/", "http://a@b@merchant.example/",
		"http://merchant.example#@127.0.0.1/", "http://127.0.0.1\\@merchant.example/", "http://[::]/", "http://[64:ff9b::a00:1]/",
	} {
		f.Add(s)
	}
	strict, lax := New(Config{}), New(Config{AllowPrivateTargets: true})
	f.Fuzz(func(t *testing.T, raw string) {
		out, err := strict.checkURL(raw)
		laxOut, laxErr := lax.checkURL(raw)
		for _, e := range []error{err, laxErr} {
			if e != nil && (facilitator.ErrorCode(e) != facilitator.EInvalid || facilitator.ErrorReason(e, "") != ReasonInvalidWebhook ||
				!strings.HasPrefix(facilitator.ErrorMessage(e), "url ")) {
				t.Fatalf("checkURL(%q) = %v", raw, e)
			}
		}
		if err == nil && (laxErr != nil || laxOut != out) {
			t.Fatalf("checkURL(%q): strict %q, lax %q %v", raw, out, laxOut, laxErr)
		}
		for _, c := range []struct {
			out    string
			err    error
			strict bool
		}{{out, err, true}, {laxOut, laxErr, false}} {
			if c.err != nil {
				continue
			}
			if len(raw) > maxURLLength {
				t.Fatalf("a %d-character URL accepted", len(raw))
			}
			u, err := url.Parse(c.out)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
				t.Fatalf("checkURL(%q) stored %q (%+v, %v)", raw, c.out, u, err)
			}
			if orig, _ := url.Parse(raw); orig == nil || orig.Hostname() != u.Hostname() {
				t.Fatalf("checkURL(%q) stored %q: the host changed", raw, c.out)
			}
			if c.strict {
				h := u.Hostname()
				if ip, err := netip.ParseAddr(h); err == nil && !publicAddr(ip) {
					t.Fatalf("checkURL(%q) accepted the private address %s", raw, ip)
				}
				if l := strings.ToLower(h); l == "localhost" || strings.HasSuffix(l, ".localhost") {
					t.Fatalf("checkURL(%q) accepted %s", raw, h)
				}
			}
			d := strict
			if !c.strict {
				d = lax
			}
			if again, err := d.checkURL(c.out); err != nil || again != c.out {
				t.Fatalf("checkURL(%q) = %q, which checks as %q, %v", raw, c.out, again, err)
			}
		}
	})
}

// FuzzPublicAddr: an address that leads to an IPv4 address (IPv4-mapped, well-known NAT64,
// 6to4) is decided as that IPv4 address is, whatever else it holds; one in a transition range
// whose IPv4 address cannot be told for sure (IPv4-compatible, local-use NAT64, Teredo) is never
// public; and no accepted address is loopback, private, link-local, multicast or unspecified.
func FuzzPublicAddr(f *testing.F) {
	for _, s := range [][]byte{
		{127, 0, 0, 1}, {10, 0, 0, 1}, {169, 254, 169, 254}, {8, 8, 8, 8}, {100, 64, 0, 1}, {0, 0, 0, 0},
		{0x20, 0x02, 0x7f, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
		{0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 0, 0, 1},
		{0x26, 0x06, 0x47, 0, 0x47, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, 0x11},
	} {
		f.Add(s)
	}
	prefix := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	never := []netip.Prefix{prefix("::/96"), prefix("64:ff9b:1::/48"), prefix("2001::/32")}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var v4 [4]byte
		copy(v4[:], raw)
		var rest [16]byte
		if len(raw) > 4 {
			copy(rest[:], raw[4:])
		}
		want := publicAddr(netip.AddrFrom4(v4))
		mapped := [16]byte{10: 0xff, 11: 0xff}
		nat := [16]byte{1: 0x64, 2: 0xff, 3: 0x9b}
		copy(mapped[12:], v4[:])
		copy(nat[12:], v4[:])
		sixTo4 := rest
		sixTo4[0], sixTo4[1] = 0x20, 0x02
		copy(sixTo4[2:6], v4[:])
		for name, a := range map[string][16]byte{"mapped": mapped, "NAT64": nat, "6to4": sixTo4} {
			if got := publicAddr(netip.AddrFrom16(a)); got != want {
				t.Fatalf("%s %s: publicAddr = %v, but %v for %s", name, netip.AddrFrom16(a), got, want, netip.AddrFrom4(v4))
			}
		}
		// Any address: the 16 bytes as they came.
		var any16 [16]byte
		copy(any16[:], raw)
		a := netip.AddrFrom16(any16)
		if !publicAddr(a) {
			return
		}
		for _, p := range never {
			if p.Contains(a) {
				t.Fatalf("publicAddr(%s) accepted an address in %s", a, p)
			}
		}
		if v, ok := embeddedIPv4(a); ok && !publicAddr(v) {
			t.Fatalf("publicAddr(%s) accepted an address leading to %s", a, v)
		}
		if u := a.Unmap(); u.IsLoopback() || u.IsPrivate() || u.IsLinkLocalUnicast() || u.IsMulticast() || u.IsUnspecified() {
			t.Fatalf("publicAddr(%s) accepted a non-public address", a)
		}
	})
}

// fuzzStreamStore is the part of Store a stream reads: one settlement, whose events are the one
// after the cursor.
type fuzzStreamStore struct {
	Store // the webhook methods: never called here
	mu    sync.Mutex
	after []int64
}

func (s *fuzzStreamStore) settlement() *facilitator.Settlement {
	return &facilitator.Settlement{ID: 7, Key: facilitator.AuthorizationKey{Network: "eip155:8453"}, State: facilitator.StateBroadcast}
}

func (s *fuzzStreamStore) SettlementByKey(context.Context, facilitator.AuthorizationKey) (*facilitator.Settlement, error) {
	return s.settlement(), nil
}

func (s *fuzzStreamStore) PaymentID(_ context.Context, _, id string) (*facilitator.PaymentIDRecord, error) {
	return &facilitator.PaymentIDRecord{ID: id, Settlement: s.settlement()}, nil
}

func (s *fuzzStreamStore) SettlementEvents(_ context.Context, id, after int64, _ []string, _ int) ([]facilitator.SettlementEvent, error) {
	s.mu.Lock()
	s.after = append(s.after, after)
	s.mu.Unlock()
	if after == math.MaxInt64 {
		return nil, nil
	}
	return []facilitator.SettlementEvent{{ID: after + 1, SettlementID: id, State: facilitator.StateMined, At: time.Unix(1700000000, 0)}}, nil
}

func (s *fuzzStreamStore) LastSettlementEvent(context.Context, int64) (int64, error) { return 41, nil }

type fuzzStreamStatus struct{}

func (fuzzStreamStatus) Authorization(_ context.Context, key facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	return facilitator.AuthorizationStatus{State: facilitator.StatusPending, Network: key.Network}, true, nil
}

// FuzzLastEventID: a Last-Event-ID is refused with invalid_last_event_id, or resumes after exactly
// the event id it spells (decimal, header whitespace aside); without one a stream opens after the
// latest event. Every frame id a stream sends resumes after that frame when sent back; and no
// outcome, refusal included, keeps a stream slot.
func FuzzLastEventID(f *testing.F) {
	for _, s := range []string{"", "0", "41", " 42 ", "+7", "007", "-1", "-0", "9223372036854775807", "9223372036854775808",
		"0x10", "1e3", "1.0", "٣", "\t5\t", "5\x00", "\u00a05", "99999999999999999999999"} {
		f.Add(s, false)
	}
	store := &fuzzStreamStore{}
	d := New(Config{Store: store, Status: fuzzStreamStatus{}, StreamPoll: time.Hour, KeepAlive: time.Hour, MaxStreams: 1})
	f.Cleanup(d.Stop)
	f.Fuzz(func(t *testing.T, lastEventID string, byPayment bool) {
		target := Target{Key: facilitator.AuthorizationKey{Network: "eip155:8453"}}
		if byPayment {
			target = Target{PaymentID: "pay_0123456789abcdef"}
		}
		open := func(id string) (*Stream, error) {
			s, err := d.OpenStream(context.Background(), target, id)
			if err != nil && (facilitator.ErrorCode(err) != facilitator.EInvalid || facilitator.ErrorReason(err, "") != "invalid_last_event_id" ||
				facilitator.ErrorMessage(err) == "") {
				t.Fatalf("OpenStream(%q) = %v", id, err)
			}
			return s, err
		}
		s, err := open(lastEventID)
		want, wantOK := int64(41), true
		if lastEventID != "" {
			want, wantOK = fuzzEventID(lastEventID)
		}
		if (err == nil) != wantOK {
			t.Fatalf("OpenStream(%q) = %v, want accepted %v", lastEventID, err, wantOK)
		}
		if err != nil {
			if n := fuzzSlots(d); n != 0 {
				t.Fatalf("a refused stream holds %d slots", n)
			}
			return
		}
		if s.after != want || s.resume != (lastEventID != "") {
			t.Fatalf("Last-Event-ID %q: after %d resume %v, want after %d", lastEventID, s.after, s.resume, want)
		}
		// Run over a finished request: the stream sends what it has on opening (the snapshot, the
		// event after the cursor) and ends. Then send each frame's id back.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var ids []string
		if err := s.Run(ctx, func(fr Frame) error { ids = append(ids, fr.ID); return nil }); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if len(ids) == 0 && want != math.MaxInt64 {
			t.Fatal("the stream sent nothing")
		}
		if n := fuzzSlots(d); n != 0 {
			t.Fatalf("a finished stream holds %d slots", n)
		}
		for _, id := range ids {
			s, err := open(id)
			if err != nil {
				t.Fatalf("frame id %q is refused as a Last-Event-ID: %v", id, err)
			}
			if strconv.FormatInt(s.after, 10) != id {
				t.Fatalf("frame id %q resumes after %d", id, s.after)
			}
			s.Close()
		}
		if n := fuzzSlots(d); n != 0 {
			t.Fatalf("closed streams hold %d slots", n)
		}
	})
}

func fuzzSlots(d *Dispatcher) int { return d.streams.Open() }

var fuzzEventIDRE = regexp.MustCompile(`^[+-]?[0-9]+$`)

// fuzzEventID is the documented Last-Event-ID: a decimal event id, header whitespace aside
// (a sign is tolerated, so "-0" is 0).
func fuzzEventID(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if !fuzzEventIDRE.MatchString(s) {
		return 0, false
	}
	n, _ := new(big.Int).SetString(strings.TrimPrefix(s, "+"), 10)
	if n.Sign() < 0 || !n.IsInt64() {
		return 0, false
	}
	return n.Int64(), true
}
