package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/console"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// liveNetwork is the network of the authorization the live tests follow.
const liveNetwork = "eip155:84532"

// countingStatus answers every authorization with st, and counts the reads.
type countingStatus struct {
	mu    sync.Mutex
	st    facilitator.AuthorizationStatus
	reads int
}

func (s *countingStatus) Authorization(context.Context, facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	return s.st, true, nil
}

func (s *countingStatus) Payment(context.Context, string, string) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
}

func (s *countingStatus) Settlement(context.Context, common.Hash) (facilitator.AuthorizationStatus, error) {
	return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
}

func (s *countingStatus) Timeline(context.Context, facilitator.AuthorizationKey) ([]facilitator.SettlementEvent, error) {
	return nil, nil
}

func (s *countingStatus) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// mined makes the authorization mined at block 10 with the chain's head at head.
func (s *countingStatus) mined(head uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = facilitator.AuthorizationStatus{State: facilitator.StatusSettled, Network: liveNetwork, Transaction: "0x" + strings.Repeat("ab", 32),
		BlockNumber: 10, Confirmations: head - 9, Head: head}
}

// fakeHeads is a subscription the test announces heads on.
type fakeHeads struct {
	mu  sync.Mutex
	fns []func(uint64)
	// following is told each time a follower starts.
	following chan struct{}
}

func (h *fakeHeads) Follow(ctx context.Context, fn func(uint64)) {
	h.mu.Lock()
	h.fns = append(h.fns, fn)
	h.mu.Unlock()
	h.following <- struct{}{}
	<-ctx.Done()
}

func (h *fakeHeads) Subscribed() bool { return true }

func (h *fakeHeads) announce(n uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fn := range h.fns {
		fn(n)
	}
}

// liveServer serves con as the API mounts it, the request's key id taken from X-Key-Id.
func liveServer(t *testing.T, con *console.Console) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		con.ServeConsole(w, r, r.Header.Get("X-Key-Id"))
	}))
	t.Cleanup(hs.Close)
	return hs.URL + "/console/authorizations/" + liveNetwork + "/0x036CbD53842c5426634e7929541eC2318f3dCF7e/" +
		"0x00000000000000000000000000000000000000aa/0x" + strings.Repeat("02", 32) + "/events"
}

// liveStream is an open /events stream: its status events' Live, in order.
type liveStream struct {
	events chan console.Live
}

func openLive(t *testing.T, u, keyID string) (*liveStream, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	req.Header.Set("X-Key-Id", keyID)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); res.Body.Close() })
	if res.StatusCode != http.StatusOK {
		return nil, res
	}
	s := &liveStream{events: make(chan console.Live, 16)}
	go func() {
		sc := bufio.NewScanner(res.Body)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				event = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok && event == "status" {
				var l console.Live
				if json.Unmarshal([]byte(v), &l) == nil {
					s.events <- l
				}
			}
		}
	}()
	return s, res
}

func (s *liveStream) next(t *testing.T) console.Live {
	t.Helper()
	select {
	case l := <-s.events:
		return l
	case <-time.After(10 * time.Second):
		t.Fatalf("no status event within 10s")
		return console.Live{}
	}
}

// openViewers opens n streams of the authorization and takes each one's first event.
func openViewers(t *testing.T, u string, n int) []*liveStream {
	t.Helper()
	var out []*liveStream
	for i := 0; i < n; i++ {
		s, res := openLive(t, u, "")
		if s == nil {
			t.Fatalf("viewer %d: HTTP %d", i, res.StatusCode)
		}
		if l := s.next(t); l.State != facilitator.StatusPending {
			t.Fatalf("viewer %d: first event %+v, want pending", i, l)
		}
		out = append(out, s)
	}
	return out
}

// TestLiveSharedReaderFollowsHeads: viewers of one authorization share one reader, which reads
// the status again when the network's head changes: N viewers cost one read per head, not N.
func TestLiveSharedReaderFollowsHeads(t *testing.T) {
	const viewers = 5
	svc := &countingStatus{st: facilitator.AuthorizationStatus{State: facilitator.StatusPending, Network: liveNetwork, Head: 5}}
	heads := &fakeHeads{following: make(chan struct{}, viewers)}
	con, err := console.New(console.Config{Status: svc, HTTPStatus: api.HTTPStatus, Poll: time.Hour,
		Heads: map[string]console.Heads{liveNetwork: heads}})
	if err != nil {
		t.Fatal(err)
	}
	u := liveServer(t, con)
	streams := openViewers(t, u, viewers)
	if n := svc.count(); n != 1 {
		t.Fatalf("%d viewers opening cost %d status reads, want 1", viewers, n)
	}
	select {
	case <-heads.following:
	case <-time.After(10 * time.Second):
		t.Fatalf("the reader never followed the heads")
	}
	for head := uint64(11); head <= 13; head++ {
		svc.mined(head)
		heads.announce(head)
		for i, s := range streams {
			if l := s.next(t); l.Confirmations != fmtUint(head-9) {
				t.Fatalf("viewer %d after head %d: %+v", i, head, l)
			}
		}
		if n, want := svc.count(), int(head-11)+2; n != want {
			t.Fatalf("after head %d: %d status reads, want %d (one per head for all %d viewers)", head, n, want, viewers)
		}
	}
}

// TestLiveSharedReaderPolls: without a head subscription, one Poll is one read for all the
// viewers of an authorization.
func TestLiveSharedReaderPolls(t *testing.T) {
	const viewers = 5
	svc := &countingStatus{st: facilitator.AuthorizationStatus{State: facilitator.StatusPending, Network: liveNetwork, Head: 5}}
	con, err := console.New(console.Config{Status: svc, HTTPStatus: api.HTTPStatus, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ticks := make(chan time.Time)
	console.SetPollTicks(con, ticks)
	u := liveServer(t, con)
	streams := openViewers(t, u, viewers)
	if n := svc.count(); n != 1 {
		t.Fatalf("%d viewers opening cost %d status reads, want 1", viewers, n)
	}
	ticks <- time.Now() // nothing changed: no event
	svc.mined(12)
	ticks <- time.Now()
	for i, s := range streams {
		if l := s.next(t); l.Confirmations != "3" {
			t.Fatalf("viewer %d after the poll: %+v", i, l)
		}
	}
	if n := svc.count(); n != 3 {
		t.Fatalf("two polls cost %d status reads with the opening one, want 3", n)
	}
}

// TestLiveStreamsPerKey: a key that holds its share of the live streams is refused its next with
// 429 too_many_streams_for_key, and another key still opens one; past the console's bound, 503.
func TestLiveStreamsPerKey(t *testing.T) {
	svc := &countingStatus{st: facilitator.AuthorizationStatus{State: facilitator.StatusPending, Network: liveNetwork, Head: 5}}
	con, err := console.New(console.Config{Status: svc, HTTPStatus: api.HTTPStatus, Poll: time.Hour, MaxStreams: 3, MaxStreamsPerKey: 2})
	if err != nil {
		t.Fatal(err)
	}
	u := liveServer(t, con)
	open := func(key string) {
		t.Helper()
		s, res := openLive(t, u, key)
		if s == nil {
			b, _ := io.ReadAll(res.Body)
			t.Fatalf("key %s: HTTP %d %s, want the stream", key, res.StatusCode, b)
		}
		s.next(t)
	}
	refused := func(key string, status int) {
		t.Helper()
		s, res := openLive(t, u, key)
		if s != nil {
			t.Fatalf("key %s: the stream opened, want %d", key, status)
		}
		if res.StatusCode != status || res.Header.Get("Retry-After") == "" {
			t.Fatalf("key %s: HTTP %d (Retry-After %q), want %d with Retry-After", key, res.StatusCode, res.Header.Get("Retry-After"), status)
		}
	}
	open("C")
	open("C")
	refused("C", http.StatusTooManyRequests)
	open("B")
	refused("A", http.StatusServiceUnavailable)
}

func fmtUint(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
