package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/notify"
)

// TestStreamsPerKey: one key that opens its share of the event streams is refused its next with
// 429 too_many_streams_for_key, and another key still opens one; only past the global bound does
// a key that holds none get 503 too_many_streams. A closed stream gives its key's slot back.
func TestStreamsPerKey(t *testing.T) {
	keys := &memKeys{keys: map[string]*facilitator.APIKey{}}
	rec := &fuzzRecorder{}
	d := notify.New(notify.Config{Store: fuzzStore{r: rec}, Status: fuzzStatus{r: rec}, StreamPoll: time.Hour, KeepAlive: time.Hour,
		MaxStreams: 3, MaxStreamsPerKey: 2})
	t.Cleanup(d.Stop)
	srv := api.New(api.Config{Verifier: &stubVerifier{}, Status: fuzzStatus{r: rec}, Notify: d,
		Auth: &api.AuthConfig{Mode: api.AuthKeys, Keys: keys}})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	byAuth := hs.URL + "/v1/events/authorizations/eip155:8453/0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913/" +
		"0x00000000000000000000000000000000000000aa/0x" + strings.Repeat("01", 32)
	byPayment := hs.URL + "/v1/events/payments/pay_0123456789abcdef"
	keyA, keyB, keyC := keys.add(t, facilitator.ScopeWebhooks), keys.add(t, facilitator.ScopeWebhooks), keys.add(t, facilitator.ScopeWebhooks)

	c1 := openKeyed(t, byAuth, keyC)
	openKeyed(t, byPayment, keyC)
	refusedStream(t, byAuth, keyC, http.StatusTooManyRequests, facilitator.ReasonTooManyStreamsForKey)
	openKeyed(t, byAuth, keyB)
	// Three are open: A, holding none, meets the global bound.
	refusedStream(t, byPayment, keyA, http.StatusServiceUnavailable, facilitator.ReasonTooManyStreams)

	c1()
	deadline := time.Now().Add(10 * time.Second)
	for !tryKeyed(t, byAuth, keyC) {
		if time.Now().After(deadline) {
			t.Fatalf("key C's closed stream never gave its slot back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openKeyed opens an event stream with key and waits for its first bytes; the returned func
// closes it (so does the test's end).
func openKeyed(t *testing.T, u, key string) (closeStream func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // also when the request fails
	res := sendKeyed(ctx, t, u, key)
	closeStream = func() { cancel(); res.Body.Close() }
	t.Cleanup(closeStream)
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("GET %s: %d %s, want the stream", u, res.StatusCode, b)
	}
	if _, err := res.Body.Read(make([]byte, 1)); err != nil {
		t.Fatalf("GET %s: the stream sent nothing: %v", u, err)
	}
	return closeStream
}

// getKeyed sends a stream's GET with key and returns the answer; it closes an opened stream at once
// and reads the body of any other answer.
func getKeyed(t *testing.T, u, key string) (res *http.Response, body []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res = sendKeyed(ctx, t, u, key)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ = io.ReadAll(res.Body)
	}
	return res, body
}

// sendKeyed sends a GET with key as the bearer and returns the answer; the caller closes its body.
func sendKeyed(ctx context.Context, t *testing.T, u, key string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// tryKeyed reports whether a stream with key opens (closing it at once).
func tryKeyed(t *testing.T, u, key string) bool {
	t.Helper()
	res, _ := getKeyed(t, u, key)
	return res.StatusCode == http.StatusOK
}

// refusedStream checks that a stream with key is refused with status and reason, and Retry-After.
func refusedStream(t *testing.T, u, key string, status int, reason string) {
	t.Helper()
	res, b := getKeyed(t, u, key)
	if res.StatusCode == http.StatusOK {
		t.Fatalf("GET %s: the stream opened, want %d %s", u, status, reason)
	}
	var body map[string]string
	if json.Unmarshal(b, &body) != nil || res.StatusCode != status || body["error"] != reason || body["message"] == "" {
		t.Fatalf("GET %s: want %d %s, got %d %s", u, status, reason, res.StatusCode, b)
	}
	if res.Header.Get("Retry-After") == "" {
		t.Fatalf("GET %s: %d without Retry-After", u, res.StatusCode)
	}
}
