package api_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// claimingSettler answers every /settle with a claimed success of settlement 42; with hold set, it
// first waits until the request's context ends (net/http cancels it when the caller closes the
// connection), as an engine does whose caller leaves between the claim and the write.
type claimingSettler struct {
	hold     bool
	entered  chan struct{}
	released chan releaseCall
	// claimBy is the claimed outcome's ClaimBy (zero: none); confirmed hears ConfirmDelivery.
	claimBy   time.Time
	confirmed chan int64
}

type releaseCall struct {
	id          int64
	hasDeadline bool
}

func newClaimingSettler(hold bool) *claimingSettler {
	return &claimingSettler{hold: hold, entered: make(chan struct{}, 1), released: make(chan releaseCall, 4), confirmed: make(chan int64, 4)}
}

func (s *claimingSettler) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	s.entered <- struct{}{}
	if s.hold {
		<-ctx.Done()
	}
	return facilitator.SettleOutcome{SettlementID: 42, Claimed: true, ClaimBy: s.claimBy, Response: facilitator.SettleResponse{
		Success: true, Transaction: common.Hash{1}.Hex(), Network: p.Network, Payer: p.Payer}}, nil
}

func (s *claimingSettler) ConfirmDelivery(_ context.Context, out facilitator.SettleOutcome) error {
	s.confirmed <- out.SettlementID
	return nil
}

func (s *claimingSettler) ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	_, ok := ctx.Deadline()
	s.released <- releaseCall{id: out.SettlementID, hasDeadline: ok}
	return nil
}

// waitServed waits until the handler of a request has returned.
func waitServed(t *testing.T, served <-chan struct{}) {
	t.Helper()
	select {
	case <-served:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler never returned")
	}
}

// newDeliveryServer serves the API over settler on a real listener; served hears each request's
// handler return.
func newDeliveryServer(t *testing.T, settler api.Settler) (hs *httptest.Server, served chan struct{}) {
	t.Helper()
	srv := api.New(api.Config{
		Verifier:  &stubVerifier{},
		Settler:   settler,
		Supported: facilitator.Supported([]facilitator.Network{testNetwork(v1Name)}, signers(), nil),
		Logger:    slog.New(slog.DiscardHandler),
	})
	served = make(chan struct{}, 4)
	hs = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.Handler().ServeHTTP(w, r)
		served <- struct{}{}
	}))
	t.Cleanup(hs.Close)
	return hs, served
}

// sendAndLeave writes a /settle request on a connection of its own and, once the settler has the
// request, closes the connection without reading the answer: a caller that timed out or died.
func sendAndLeave(t *testing.T, addr string, body []byte, entered <-chan struct{}) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(conn)
	fmt.Fprintf(w, "POST /settle HTTP/1.1\r\nHost: facilitator.test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	w.Write(body)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the settler never got the request")
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSettleReleasesUndelivered: a claimed success whose caller closed the connection before the
// answer was written is released (under a bounded context), so the honest retry can get it; a
// success the caller read is not.
func TestSettleReleasesUndelivered(t *testing.T) {
	body := newPayment(t, 1).body(t)

	t.Run("caller left", func(t *testing.T) {
		settler := newClaimingSettler(true)
		hs, served := newDeliveryServer(t, settler)
		sendAndLeave(t, hs.Listener.Addr().String(), body, settler.entered)
		waitServed(t, served)
		// The handler releases before it returns.
		select {
		case rel := <-settler.released:
			if rel.id != 42 || !rel.hasDeadline {
				t.Fatalf("released %d (deadline %v), want settlement 42 under a bounded context", rel.id, rel.hasDeadline)
			}
		default:
			t.Fatal("the handler returned without releasing the success its caller never got")
		}
	})

	t.Run("too late to write", func(t *testing.T) {
		// Past ClaimBy the claim's lease may end before the answer lands: the caller is told
		// pending and the success given back, never written.
		settler := newClaimingSettler(false)
		settler.claimBy = time.Now().Add(-time.Second)
		hs, served := newDeliveryServer(t, settler)
		r := do(t, http.MethodPost, hs.URL+"/settle", body)
		if res, _ := settlement(t, r); r.Status != http.StatusOK || res.Success || res.ErrorReason != facilitator.ReasonSettlementPending || res.Transaction == "" {
			t.Fatalf("want 200 settlement_pending with the hash, got %s", r)
		}
		<-served
		select {
		case rel := <-settler.released:
			if rel.id != 42 {
				t.Fatalf("released settlement %d, want 42", rel.id)
			}
		default:
			t.Fatal("the success not written was not given back")
		}
		select {
		case id := <-settler.confirmed:
			t.Fatalf("confirmed settlement %d, whose success was not written", id)
		default:
		}
	})

	t.Run("caller read it", func(t *testing.T) {
		settler := newClaimingSettler(false)
		hs, served := newDeliveryServer(t, settler)
		r := do(t, http.MethodPost, hs.URL+"/settle", body)
		if res, _ := settlement(t, r); r.Status != http.StatusOK || !res.Success {
			t.Fatalf("want 200 success, got %s", r)
		}
		if r.Header.Get("Content-Length") == "" || len(r.Header.Values("Transfer-Encoding")) != 0 {
			t.Fatalf("want a plain answer with a length, got headers %v", r.Header)
		}
		waitServed(t, served)
		select {
		case rel := <-settler.released:
			t.Fatalf("released settlement %d, whose success the caller read", rel.id)
		default:
		}
		// Written: the claim is confirmed, before the handler returns.
		select {
		case id := <-settler.confirmed:
			if id != 42 {
				t.Fatalf("confirmed settlement %d, want 42", id)
			}
		default:
			t.Fatal("the handler returned without confirming the success its caller read")
		}
	})
}

// TestSettleReleasesUndeliveredEngine: on the real engine and ledger, a caller that leaves after
// its success was claimed and before the answer was written does not count: its honest retry of
// the same payload gets success: true with the same transaction, and only once.
func TestSettleReleasesUndeliveredEngine(t *testing.T) {
	ledger(t)
	var leaving *leavingSettler
	s := newSettleStack(t, settleOptions{server: func(cfg *api.Config, _ *settleStack) {
		leaving = &leavingSettler{Settler: cfg.Settler, entered: make(chan struct{}, 1), released: make(chan int64, 1)}
		cfg.Settler = leaving
	}})
	p := fundedPayment(t)
	body := p.body(t)

	sendAndLeave(t, s.URL[len("http://"):], body, leaving.entered)
	var id int64
	select {
	case id = <-leaving.released:
	case <-time.After(30 * time.Second):
		t.Fatalf("the success claimed for a caller who left was never released\n%s", s.Logs)
	}
	if row, err := s.DB.SettlementByID(context.Background(), id); err != nil || !row.State.Succeeded() || row.Delivered {
		t.Fatalf("settlement %d after the release: %+v %v; want mined and not delivered", id, row, err)
	}

	r := s.settle(t, body)
	res, _ := settlement(t, r)
	if r.Status != http.StatusOK || !res.Success || !txHashRE.MatchString(res.Transaction) {
		t.Fatalf("the honest retry: want 200 success, got %s", r)
	}
	again := s.settle(t, body)
	if res2, _ := settlement(t, again); res2.Success || res2.ErrorReason != facilitator.ReasonAlreadySettled || res2.Transaction != res.Transaction {
		t.Fatalf("a third request: want already_settled with %s, got %s", res.Transaction, again)
	}
	if got := usdcOf(t, p.auth.To); got != p.auth.Value.Int64() {
		t.Fatalf("payee holds %d, want %s once", got, p.auth.Value)
	}
}

// leavingSettler is the engine, holding its first claimed success until the caller has left.
type leavingSettler struct {
	api.Settler
	held     atomic.Bool
	entered  chan struct{}
	released chan int64
}

func (l *leavingSettler) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	out, err := l.Settler.Settle(ctx, p)
	if err == nil && out.Claimed && l.held.CompareAndSwap(false, true) {
		l.entered <- struct{}{}
		<-ctx.Done()
	}
	return out, err
}

func (l *leavingSettler) ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	err := l.Settler.ReleaseDelivery(ctx, out)
	if err == nil {
		l.released <- out.SettlementID
	}
	return err
}
