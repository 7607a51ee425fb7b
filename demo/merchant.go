package demo

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The x402 v2 HTTP headers, as the official packages name them.
const (
	headerPaymentRequired  = "PAYMENT-REQUIRED"
	headerPaymentSignature = "PAYMENT-SIGNATURE"
	headerPaymentResponse  = "PAYMENT-RESPONSE"
)

// paymentRequired is the x402 v2 PaymentRequired a 402 carries (base64 JSON in PAYMENT-REQUIRED).
type paymentRequired struct {
	X402Version int                               `json:"x402Version"`
	Error       string                            `json:"error,omitempty"`
	Resource    *facilitator.ResourceInfo         `json:"resource,omitempty"`
	Accepts     []facilitator.PaymentRequirements `json:"accepts"`
	Extensions  map[string]json.RawMessage        `json:"extensions,omitempty"`
}

// merchant is a paid endpoint that does what the official x402 middleware does with a payment:
// verify it with the facilitator, produce the content, settle, and answer with PAYMENT-RESPONSE;
// then it records with the facilitator the SHA-256 of what it served.
type merchant struct {
	fac      *client.Client
	reqs     facilitator.PaymentRequirements
	resource facilitator.ResourceInfo
	say      func(format string, args ...any)
	// dropNext makes the next paid response vanish after settling: the connection is closed
	// without an answer, as a crashed proxy or a cut network would.
	dropNext atomic.Bool

	mu      sync.Mutex
	settled []string // the transactions settle answered with, in order
}

func (m *merchant) settlements() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.settled...)
}

func (m *merchant) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	header := r.Header.Get(headerPaymentSignature)
	if header == "" {
		m.paymentRequired(w, "PAYMENT-SIGNATURE header is required")
		return
	}
	raw, err := base64.StdEncoding.DecodeString(header)
	var pp facilitator.PaymentPayload
	if err == nil {
		err = json.Unmarshal(raw, &pp)
	}
	if err != nil || pp.X402Version != 2 {
		m.paymentRequired(w, "invalid PAYMENT-SIGNATURE header")
		return
	}
	if !sameRequirements(pp.Accepted, m.reqs) {
		m.paymentRequired(w, "no matching payment requirements")
		return
	}
	ctx := r.Context()
	body := mustJSON(facilitator.Request{X402Version: json.RawMessage("2"), PaymentPayload: raw, PaymentRequirements: mustJSON(m.reqs)})
	vr, err := m.fac.Verify(ctx, body)
	if err != nil {
		m.say("verify  → error: %v", err)
		http.Error(w, "the facilitator could not verify the payment", http.StatusBadGateway)
		return
	}
	if !vr.IsValid {
		m.say("verify  → invalid: %s", vr.InvalidReason)
		m.paymentRequired(w, vr.InvalidReason)
		return
	}
	m.say("verify  → valid%s", replayNote(vr.Extensions, "this id's payment is already settled"))

	content := mustJSON(map[string]any{"city": "Lisbon", "forecast": "sunny", "temperatureC": 23})

	sr, err := m.fac.Settle(ctx, body)
	if err != nil {
		m.say("settle  → error: %v", err)
		http.Error(w, "the facilitator could not settle the payment", http.StatusBadGateway)
		return
	}
	if !sr.Success {
		m.say("settle  → failed: %s", sr.ErrorReason)
		m.paymentRequired(w, sr.ErrorReason)
		return
	}
	m.mu.Lock()
	m.settled = append(m.settled, sr.Transaction)
	m.mu.Unlock()
	m.say("settle  → success, transaction %s%s", sr.Transaction, replayNote(sr.Extensions, "the stored answer, nothing broadcast"))

	if m.dropNext.CompareAndSwap(true, false) {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				m.say("the response is lost: the connection closes before any answer")
				_ = conn.Close()
				return
			}
		}
		m.say("could not drop the connection; answering normally")
	}
	served := append(content, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(headerPaymentResponse, base64.StdEncoding.EncodeToString(mustJSON(sr)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(served)
	m.say("answers 200 with the weather and a PAYMENT-RESPONSE header")
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	m.recordDelivery(ctx, sr.Transaction, body, served)
}

// recordDelivery records with the facilitator what was served for the payment settled by tx: the
// SHA-256 of served, which the agent can compare with the hash of what it received. It runs
// before the handler returns, so the response's last chunk, and so the agent's read, wait for
// it: the agent's lookup then finds the record. A merchant that would not delay its answer
// records it after, in the background. A failure is said, not answered: the content was served.
func (m *merchant) recordDelivery(ctx context.Context, tx string, request, served []byte) {
	var key *facilitator.AuthorizationKey
	if p, err := facilitator.DecodeRequest(request); err == nil {
		key = &facilitator.AuthorizationKey{Network: p.Network, Asset: p.Requirements.Asset, Payer: p.Authorization.From, Nonce: p.Authorization.Nonce}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	ans, err := m.fac.AttachDelivery(ctx, common.HexToHash(tx), key, served, "application/json")
	if err != nil {
		m.say("delivery → not recorded: %v", err)
		return
	}
	m.say("delivery → recorded sha256 %s of the %d bytes served", short(ans.Delivery.SHA256), len(served))
}

// paymentRequired answers 402 with the x402 v2 PaymentRequired in its header (and, for people
// with curl, in the body).
func (m *merchant) paymentRequired(w http.ResponseWriter, reason string) {
	resource := m.resource
	pr := paymentRequired{
		X402Version: 2, Error: reason, Resource: &resource, Accepts: []facilitator.PaymentRequirements{m.reqs},
		Extensions: map[string]json.RawMessage{facilitator.PaymentIdentifierKey: json.RawMessage(`{"info":{"required":false}}`)},
	}
	b := mustJSON(pr)
	w.Header().Set(headerPaymentRequired, base64.StdEncoding.EncodeToString(b))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusPaymentRequired)
	_, _ = w.Write(append(b, '\n'))
}

// sameRequirements is the middleware's match of the client's accepted option against its own.
func sameRequirements(a, b facilitator.PaymentRequirements) bool {
	return a.Scheme == b.Scheme && a.Network == b.Network && a.Amount == b.Amount &&
		strings.EqualFold(a.Asset, b.Asset) && strings.EqualFold(a.PayTo, b.PayTo)
}

// replayNote marks what the facilitator answered as a replay under the payment id.
func replayNote(ext map[string]any, what string) string {
	if facilitator.IsReplay(ext) {
		return "   REPLAY: " + what
	}
	return ""
}
