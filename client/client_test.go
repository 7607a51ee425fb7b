package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestSettleRetriesTheSamePayload: while the outcome is not known, Settle resends exactly the
// payload it was given (never a new one), honouring Retry-After, and returns the final answer.
func TestSettleRetriesTheSamePayload(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	answers := []struct {
		status int
		res    facilitator.SettleResponse
	}{
		{http.StatusServiceUnavailable, facilitator.SettleResponse{ErrorReason: "unexpected_settle_error", Network: "eip155:1"}},
		{http.StatusOK, facilitator.SettleResponse{ErrorReason: facilitator.ReasonSettlementPending, Transaction: "0xab", Network: "eip155:1"}},
		{http.StatusOK, facilitator.SettleResponse{ErrorReason: facilitator.ReasonPaymentInFlight, Transaction: "0xab", Network: "eip155:1"}},
		{http.StatusOK, facilitator.SettleResponse{Success: true, Transaction: "0xab", Network: "eip155:1"}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		i := len(bodies)
		bodies = append(bodies, b)
		mu.Unlock()
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(answers[i].status)
		_ = json.NewEncoder(w).Encode(answers[i].res)
	}))
	defer srv.Close()

	payload := []byte(`{"x402Version":2,"paymentPayload":{"x402Version":2},"paymentRequirements":{}}`)
	res, err := client.New(srv.URL).Settle(context.Background(), payload)
	if err != nil || !res.Success || res.Transaction != "0xab" {
		t.Fatalf("got %+v, %v", res, err)
	}
	if len(bodies) != 4 {
		t.Fatalf("%d requests, want 4", len(bodies))
	}
	for i, b := range bodies {
		if !bytes.Equal(b, payload) {
			t.Fatalf("request %d sent %s, not the original payload", i, b)
		}
	}
}

// answeringServer answers every request with status, Retry-After retryAfter ("" for none) and
// res, until the test ends; calls counts the requests.
func answeringServer(t *testing.T, status int, retryAfter string, res facilitator.SettleResponse) (url string, calls *int) {
	calls = new(int)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*calls++
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(res)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, calls
}

// TestSettleStopsAtTheLimit: past its retries the client returns the pending answer with its hash,
// for the caller to look up later, and does not keep going.
func TestSettleStopsAtTheLimit(t *testing.T) {
	url, calls := answeringServer(t, http.StatusOK, "0", facilitator.SettleResponse{ErrorReason: facilitator.ReasonSettlementPending, Transaction: "0xcd", Network: "n"})
	res, err := client.New(url, client.WithRetries(2)).Settle(context.Background(), []byte(`{}`))
	if err != nil || res.ErrorReason != facilitator.ReasonSettlementPending || res.Transaction != "0xcd" || *calls != 3 {
		t.Fatalf("got %+v, %v after %d calls", res, err, *calls)
	}
}

// TestSettleDefiniteErrors: a 409 or 400 is not retried; the reason reaches the caller.
func TestSettleDefiniteErrors(t *testing.T) {
	url, calls := answeringServer(t, http.StatusConflict, "", facilitator.SettleResponse{ErrorReason: facilitator.ReasonPaymentIdentifierConflict, ErrorMessage: "differs", Network: "n"})
	_, err := client.New(url).Settle(context.Background(), []byte(`{}`))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusConflict || ce.Reason != facilitator.ReasonPaymentIdentifierConflict || *calls != 1 {
		t.Fatalf("got %v after %d calls", err, *calls)
	}
}

// TestSettleHonoursTheDeadline: a Retry-After longer than the caller's deadline ends the retries.
func TestSettleHonoursTheDeadline(t *testing.T) {
	url, calls := answeringServer(t, http.StatusOK, "60", facilitator.SettleResponse{ErrorReason: facilitator.ReasonSettlementPending, Transaction: "0xef", Network: "n"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := client.New(url).Settle(ctx, []byte(`{}`))
	if err != nil || res.Transaction != "0xef" || *calls != 1 || ctx.Err() != nil {
		t.Fatalf("got %+v, %v after %d calls (ctx %v): it must return the pending answer at once, not wait past the deadline", res, err, *calls, ctx.Err())
	}
}

func TestStatusNotFound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":"not_found","message":"nothing"}`))
	}))
	defer srv.Close()
	if _, err := client.New(srv.URL).Payment(context.Background(), "pay_0123456789abcdef"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("got %v", err)
	}
}

// TestLookupsAskAgainAfter503: a lookup answered 503 (the facilitator could not read the chain
// just then) is asked again after Retry-After, up to the retry limit; a fault-proxy load run
// counted a single 503 as a wrong status answer.
func TestLookupsAskAgainAfter503(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n <= 2 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"status_timeout","message":"the node did not answer"}`))
			return
		}
		_, _ = w.Write([]byte(`{"state":"settled","settledBy":"facilitator"}`))
	}))
	defer srv.Close()
	st, err := client.New(srv.URL).Payment(context.Background(), "pay_0123456789abcdef")
	if err != nil || st.State != "settled" || calls != 3 {
		t.Fatalf("got %+v, %v after %d calls; want settled after 3", st, err, calls)
	}
	calls = 0
	_, err = client.New(srv.URL, client.WithRetries(1)).Payment(context.Background(), "pay_0123456789abcdef")
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || calls != 2 {
		t.Fatalf("with 1 retry: %v after %d calls; want the 503 after 2", err, calls)
	}
}

// TestAttachDelivery: AttachDelivery posts the body's SHA-256 and size, the content type and the
// authorization to /v1/settlements/{tx}/delivery; it sends the same record again after a 503
// (it is kept once, so a resend is safe), and a refusal is an *Error with the facilitator's reason.
func TestAttachDelivery(t *testing.T) {
	served := []byte(`{"city":"Lisbon"}` + "\n")
	sum := sha256.Sum256(served)
	tx := common.HexToHash("0xcd")
	key := facilitator.AuthorizationKey{Network: "eip155:8453", Asset: common.HexToAddress("0xa"), Payer: common.HexToAddress("0xb"), Nonce: [32]byte{7}}
	var mu sync.Mutex
	var bodies []map[string]any
	statuses := []int{http.StatusServiceUnavailable, http.StatusCreated, http.StatusConflict}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b map[string]any
		_ = json.NewDecoder(r.Body).Decode(&b)
		mu.Lock()
		i := len(bodies)
		bodies = append(bodies, b)
		mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != "/v1/settlements/"+tx.Hex()+"/delivery" {
			t.Errorf("%s %s", r.Method, r.URL.Path)
		}
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(statuses[i])
		switch statuses[i] {
		case http.StatusCreated:
			_ = json.NewEncoder(w).Encode(facilitator.DeliveryAnswer{Network: key.Network, Status: "/v1/authorizations/x",
				Delivery: facilitator.DeliveryRecord{SHA256: b["sha256"].(string), RecordedAt: time.Unix(1, 0).UTC()}})
		default:
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "delivery_conflict", "message": "a different delivery"})
		}
	}))
	defer srv.Close()
	c := client.New(srv.URL)

	ans, err := c.AttachDelivery(context.Background(), tx, &key, served, "application/json")
	if err != nil || ans.Delivery.SHA256 != hexutil.Encode(sum[:]) || ans.Status != "/v1/authorizations/x" {
		t.Fatalf("got %+v, %v", ans, err)
	}
	want := map[string]any{"sha256": hexutil.Encode(sum[:]), "contentType": "application/json", "size": float64(len(served)),
		"authorization": map[string]any{"network": key.Network, "asset": key.Asset.Hex(), "from": key.Payer.Hex(), "nonce": hexutil.Encode(key.Nonce[:])}}
	if len(bodies) != 2 || !reflect.DeepEqual(bodies[0], want) || !reflect.DeepEqual(bodies[1], want) {
		t.Fatalf("sent %v, want twice %v", bodies, want)
	}
	_, err = c.AttachDelivery(context.Background(), tx, nil, []byte("another"), "")
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusConflict || e.Reason != "delivery_conflict" {
		t.Fatalf("a refusal: %v", err)
	}
	if _, ok := bodies[2]["authorization"]; ok {
		t.Fatalf("without an authorization, sent %v", bodies[2])
	}
}
