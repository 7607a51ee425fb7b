package notify

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

func TestBackoff(t *testing.T) {
	for _, c := range []struct {
		attempt int
		want    time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {10, 512 * time.Second},
		{11, 10 * time.Minute}, {20, 10 * time.Minute}, {1 << 20, 10 * time.Minute}, {0, time.Second},
	} {
		if got := backoff(time.Second, 10*time.Minute, c.attempt); got != c.want {
			t.Errorf("backoff after attempt %d = %s, want %s", c.attempt, got, c.want)
		}
	}
}

// TestSignature pins the signature to a vector computed outside Go:
// printf '1700000000.{"id":"1"}' | openssl dgst -sha256 -hmac secret
func TestSignature(t *testing.T) {
	const want = "sha256=086f6aff7bd084c98679825129c5a64dbad88c760016d6d2c0fb123f27951d54"
	if got := signature("secret", 1700000000, []byte(`{"id":"1"}`)); got != want {
		t.Fatalf("signature = %s, want %s", got, want)
	}
}

// TestValidSignature: a receiver accepts the vector above and refuses any change to the
// timestamp, the body, the secret or the header.
func TestValidSignature(t *testing.T) {
	const sig = "sha256=086f6aff7bd084c98679825129c5a64dbad88c760016d6d2c0fb123f27951d54"
	body := []byte(`{"id":"1"}`)
	if !ValidSignature("secret", 1700000000, body, sig) {
		t.Fatal("the vector's signature refused")
	}
	for name, ok := range map[string]bool{
		"timestamp": ValidSignature("secret", 1700000001, body, sig),
		"body":      ValidSignature("secret", 1700000000, []byte(`{"id":"2"}`), sig),
		"secret":    ValidSignature("secret2", 1700000000, body, sig),
		"header":    ValidSignature("secret", 1700000000, body, sig[:len(sig)-1]+"5"),
		"empty":     ValidSignature("secret", 1700000000, body, ""),
	} {
		if ok {
			t.Errorf("a changed %s was accepted", name)
		}
	}
}

func TestCheckURL(t *testing.T) {
	strict, lax := New(Config{}), New(Config{AllowPrivateTargets: true})
	for _, c := range []struct {
		url           string
		strict, lax   bool // accepted
		wantInMessage string
	}{
		{"https://merchant.example/hooks/x402?token=abc", true, true, ""},
		{"http://merchant.example:8080/", true, true, ""},
		{"https://8.8.8.8/hook", true, true, ""},
		{"", false, false, "required"},
		{"ftp://merchant.example/", false, false, "http or https"},
		{"merchant.example/hook", false, false, "http or https"},
		{"https:///path", false, false, "no host"},
		{"https://user:pass@merchant.example/", false, false, "credentials"},
		{"https://merchant.example/" + strings.Repeat("a", 2048), false, false, "2048"},
		{"http://127.0.0.1:9000/", false, true, "public"},
		{"http://localhost/", false, true, "public"},
		{"http://api.localhost/", false, true, "public"},
		{"http://10.1.2.3/", false, true, "public"},
		{"http://169.254.169.254/latest/meta-data", false, true, "public"},
		{"http://[::1]/", false, true, "public"},
		{"http://[fd00::1]/", false, true, "public"},
		{"http://100.100.100.200/", false, true, "public"},
		{"http://[::ffff:10.0.0.1]/", false, true, "public"},
		{"http://[::127.0.0.1]/", false, true, "public"},
		{"http://[64:ff9b::7f00:1]/", false, true, "public"},
		{"http://[2002:7f00:1::1]/", false, true, "public"},
		{"http://[2001::7f00:1]:8080/", false, true, "public"},
		{"http://[64:ff9b::808:808]/", true, true, ""},
		{"http://0.0.0.0/", false, true, "public"},
		{"%zz", false, false, "parse"},
	} {
		for _, m := range []struct {
			d    *Dispatcher
			want bool
			name string
		}{{strict, c.strict, "strict"}, {lax, c.lax, "allowing private targets"}} {
			_, err := m.d.checkURL(c.url)
			if (err == nil) != m.want {
				t.Errorf("%s: checkURL(%q) = %v, want accepted=%v", m.name, c.url, err, m.want)
				continue
			}
			if err != nil {
				if facilitator.ErrorCode(err) != facilitator.EInvalid || facilitator.ErrorReason(err, "") != ReasonInvalidWebhook ||
					!strings.Contains(facilitator.ErrorMessage(err), c.wantInMessage) {
					t.Errorf("%s: checkURL(%q) = %v, want invalid_webhook saying %q", m.name, c.url, err, c.wantInMessage)
				}
			}
		}
	}
}

// TestPublicAddr: the address check made at registration and at dial time. An IPv6 address
// that leads to an IPv4 one (mapped, compatible, NAT64, 6to4, Teredo) is refused unless that
// IPv4 address is public and can be told for sure.
func TestPublicAddr(t *testing.T) {
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"8.8.8.8", true}, {"2606:4700:4700::1111", true}, {"127.0.0.1", false}, {"10.0.0.1", false}, {"172.16.0.1", false},
		{"192.168.1.1", false}, {"169.254.169.254", false}, {"100.64.0.1", false}, {"::1", false}, {"fe80::1", false},
		{"fc00::1", false}, {"::ffff:127.0.0.1", false}, {"224.0.0.1", false}, {"255.255.255.255", false}, {"0.1.2.3", false},
		{"::", false}, {"192.88.99.1", false},
		// IPv4-mapped: decided on the IPv4 address.
		{"::ffff:10.0.0.1", false}, {"::ffff:169.254.169.254", false}, {"::ffff:8.8.8.8", true},
		// IPv4-compatible (deprecated): refused whatever it holds.
		{"::127.0.0.1", false}, {"::10.0.0.1", false}, {"::8.8.8.8", false}, {"::7f00:1", false},
		// Well-known NAT64: decided on the IPv4 address (a DNS64 network gives every IPv4-only
		// receiver such an address).
		{"64:ff9b::7f00:1", false}, {"64:ff9b::10.0.0.1", false}, {"64:ff9b::169.254.169.254", false},
		{"64:ff9b::100.64.0.1", false}, {"64:ff9b::8.8.8.8", true},
		// Local-use NAT64: where the IPv4 address sits is the network's choice: refused.
		{"64:ff9b:1::7f00:1", false}, {"64:ff9b:1::8.8.8.8", false}, {"64:ff9b:1:7f00:1::", false},
		// 6to4: decided on the IPv4 address in bits 16 to 47.
		{"2002:7f00:1::1", false}, {"2002:a00:1::1", false}, {"2002:a9fe:a9fe::1", false}, {"2002:c0a8:101::", false},
		{"2002:808:808::1", true},
		// Teredo: the client's address is obfuscated behind a server's: refused.
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", false}, {"2001::7f00:1", false},
		// Documentation, discard-only, site-local.
		{"2001:db8::1", false}, {"100::1", false}, {"fec0::1", false},
		// Scoped to an interface.
		{"2606:4700:4700::1111%eth0", false}, {"fe80::1%eth0", false},
	} {
		if got := publicAddr(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("publicAddr(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
}

// TestClientRefusesPrivateTargets: the check runs on the dialled address, so a name that resolves
// inward (or a URL stored before the rules changed) is refused too, and no redirect is followed.
func TestClientRefusesPrivateTargets(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	}))
	defer srv.Close()
	ctx := context.Background()
	post := func(c *http.Client, u string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader("{}"))
		return c.Do(req)
	}
	name := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	for _, u := range []string{srv.URL, name} {
		_, err := post(newClient(time.Second, false), u)
		if err == nil || !strings.Contains(err.Error(), "not a public address") {
			t.Errorf("POST %s with private targets refused: err = %v", u, err)
		}
	}
	// The receiver's loopback address spelt as IPv6 addresses that lead to it: refused when
	// dialled, as when registered.
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	for _, host := range []string{"[::ffff:127.0.0.1]", "[::127.0.0.1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::1]", "[64:ff9b:1::7f00:1]", "[2001::7f00:1]"} {
		u := "http://" + host + ":" + port + "/"
		_, err := post(newClient(time.Second, false), u)
		if err == nil || !strings.Contains(err.Error(), "not a public address") {
			t.Errorf("POST %s with private targets refused: err = %v, want the dial refused", u, err)
		}
	}
	if hits != 0 {
		t.Fatalf("the receiver was reached %d times", hits)
	}
	res, err := post(newClient(time.Second, true), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusFound || hits != 1 {
		t.Fatalf("redirect: status %d after %d requests, want the 302 itself after 1", res.StatusCode, hits)
	}
}

// TestStopIsIdempotent: Stop before Start, twice, and a Start after Stop all behave.
func TestStopIsIdempotent(t *testing.T) {
	d := New(Config{})
	d.Stop()
	d.Stop()
	if err := d.Start(context.Background()); !errors.Is(err, errClosed) {
		t.Fatalf("Start after Stop = %v, want errClosed", err)
	}
}

// fakeStatus answers every status query with st.
type fakeStatus struct {
	st facilitator.AuthorizationStatus
}

func (f fakeStatus) Authorization(context.Context, facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	return f.st, true, nil
}

// TestAttemptOutcome: a failed attempt is retried after the backoff, or given up at MaxAttempts;
// its error names the cause without the URL (whose query may hold a merchant's token).
func TestAttemptOutcome(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	d := New(Config{Status: fakeStatus{}, MaxAttempts: 3, BaseBackoff: time.Second})
	del := facilitator.WebhookDelivery{WebhookID: "wh_1", URL: srv.URL + "/hook?token=s3cret", Secret: "k", Event: facilitator.SettlementEvent{ID: 7, State: facilitator.StateMined}}
	for attempt, want := range map[int]facilitator.DeliveryAttempt{
		1: {WebhookID: "wh_1", EventID: 7, RetryIn: time.Second},
		2: {WebhookID: "wh_1", EventID: 7, RetryIn: 2 * time.Second},
		3: {WebhookID: "wh_1", EventID: 7, GiveUp: true},
	} {
		del.Attempt = attempt
		got, o := d.attempt(context.Background(), del)
		if o != endpointDown {
			t.Errorf("attempt %d: endpoint outcome %v, want down (the dial was refused)", attempt, o)
		}
		if !strings.Contains(got.Error, "not a public address") || strings.Contains(got.Error, "s3cret") || strings.Contains(got.Error, "/hook") {
			t.Errorf("attempt %d: error %q, want the cause without the URL", attempt, got.Error)
		}
		got.Error = ""
		if got != want {
			t.Errorf("attempt %d: %+v, want %+v", attempt, got, want)
		}
	}
	d = New(Config{Status: fakeStatus{}, AllowPrivateTargets: true})
	del.Attempt = 1
	if got, o := d.attempt(context.Background(), del); !got.Delivered || got.HTTPStatus != 200 || got.Error != "" || o != endpointUp {
		t.Fatalf("a 200: %+v, endpoint %v, want delivered and up", got, o)
	}
}
