// Package paymentid implements the payment-identifier extension on the facilitator side: an id
// is bound to the request it first came with (its fingerprint), a retry with the same id and
// request gets the stored answer without anything being sent again, a different request under
// the same id is a conflict, and the id keeps resolving to its settlement long after the stored
// answer is gone (ARCHITECTURE.md invariant 5).
package paymentid

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Store is the part of the ledger ids live in.
type Store interface {
	PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error)
	// StorePaymentResponse stores an answer under an id bound to the fingerprint bound (or, for an
	// id bound before ids covered the resource, to the payment's fingerprint legacy); stored is
	// false when the id is bound to neither (or is not bound).
	StorePaymentResponse(ctx context.Context, scope, id string, bound, legacy facilitator.Fingerprint, response []byte, expires time.Time) (stored bool, err error)
	CompactPaymentIDs(ctx context.Context, now time.Time) (int64, error)
}

// Settler settles payments (the settle engine). It binds a new settlement's payment id itself, in
// the statement that writes the settlement, and fails with facilitator.ErrPaymentIDTaken, nothing
// sent, when the id is already bound: the conflict is this service's to answer.
type Settler interface {
	Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error)
	ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error
	ConfirmDelivery(ctx context.Context, out facilitator.SettleOutcome) error
}

// Verifier verifies payments.
type Verifier interface {
	Verify(ctx context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error)
}

// Config configures the service.
type Config struct {
	Store    Store
	Settler  Settler
	Verifier Verifier
	// Window is how long a stored answer is kept (default 24 h); never less than the
	// authorization's validBefore plus FinalityMargin.
	Window         time.Duration
	FinalityMargin time.Duration // default 1 h
	Now            func() time.Time
	Logger         *slog.Logger
}

// Service wraps verify and settle with payment-identifier semantics. Requests without an id pass
// straight through.
type Service struct {
	cfg       Config
	log       *slog.Logger
	conflicts atomic.Int64
	replays   atomic.Int64
}

// New builds the service.
func New(cfg Config) *Service {
	if cfg.Window == 0 {
		cfg.Window = 24 * time.Hour
	}
	if cfg.FinalityMargin == 0 {
		cfg.FinalityMargin = time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, log: cfg.Logger}
}

// Counts reports how many conflicts and replays the service has answered since it started.
func (s *Service) Counts() (conflicts, replays int64) { return s.conflicts.Load(), s.replays.Load() }

// Settle settles p under its payment id.
func (s *Service) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	if p.PaymentID == "" {
		return s.cfg.Settler.Settle(ctx, p)
	}
	rec, err := s.lookup(ctx, p)
	if err != nil {
		return facilitator.SettleOutcome{}, err
	}
	if rec == nil {
		out, err := s.cfg.Settler.Settle(ctx, p)
		if errors.Is(err, facilitator.ErrPaymentIDTaken) {
			// Bound by a concurrent request after our lookup: say what differs, if the record
			// can be read.
			rec, lerr := s.cfg.Store.PaymentID(ctx, p.IDScope, p.PaymentID)
			if lerr != nil {
				rec = nil
			}
			return facilitator.SettleOutcome{}, s.conflict(ctx, p, rec, err)
		}
		if err != nil {
			return out, err
		}
		if out.Claimed {
			// A request for the same payment and another resource can pass the lookup before the
			// first binds the id, follow the first's settlement, and claim its success: it is
			// still a conflict. The success stays claimed: the id's own request gets it as a
			// replay, and nobody gets it twice.
			if rec, lerr := s.cfg.Store.PaymentID(ctx, p.IDScope, p.PaymentID); lerr == nil && !rec.BindsTo(p) {
				// Kept for good: the claim counts without an answer of its own written.
				if cerr := s.cfg.Settler.ConfirmDelivery(ctx, out); cerr != nil {
					return facilitator.SettleOutcome{}, cerr
				}
				return facilitator.SettleOutcome{}, s.conflict(ctx, p, rec, nil)
			}
		}
		if out.Response.ErrorReason == facilitator.ReasonAlreadySettled {
			// A concurrent request with this id and payment bound it and took the success first:
			// this one is a retry of it, owed the same answer.
			if rec, lerr := s.cfg.Store.PaymentID(ctx, p.IDScope, p.PaymentID); lerr == nil &&
				rec.BindsTo(p) && rec.Settlement.ID == out.SettlementID {
				s.replays.Add(1)
				return s.replayed(ctx, p, out), nil
			}
		}
		if s.rememberClaimed(ctx, p, out) == refused {
			// Not stored: when the id is bound to another request (one for the same payment and
			// another resource won the id after this one's lookup), this one is its conflict, and
			// the answer stored under the id stays the bound request's.
			if rec, lerr := s.cfg.Store.PaymentID(ctx, p.IDScope, p.PaymentID); lerr == nil && !rec.BindsTo(p) {
				return facilitator.SettleOutcome{}, s.conflict(ctx, p, rec, nil)
			}
		}
		return out, nil
	}
	return s.replaySettle(ctx, p, rec)
}

// lookup returns p's id record when the id is known and bound to p itself; nil when the id is
// new; a conflict error when it is bound to another request.
func (s *Service) lookup(ctx context.Context, p *facilitator.Payment) (*facilitator.PaymentIDRecord, error) {
	rec, err := s.cfg.Store.PaymentID(ctx, p.IDScope, p.PaymentID)
	switch {
	case errors.Is(err, facilitator.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "the payment-identifier store is unavailable; nothing was sent, retry", err)
	case !rec.BindsTo(p):
		return nil, s.conflict(ctx, p, rec, nil)
	}
	return rec, nil
}

// replaySettle answers a retry of a request already settled (or settling) under its id. Nothing is
// sent: the stored answer is returned while it is kept, else the settlement's own state, waited for
// within the deadline when it is still in flight.
func (s *Service) replaySettle(ctx context.Context, p *facilitator.Payment, rec *facilitator.PaymentIDRecord) (facilitator.SettleOutcome, error) {
	s.replays.Add(1)
	if rec.Response != nil && s.cfg.Now().Before(rec.ResponseExpires) {
		var res facilitator.SettleResponse
		if err := json.Unmarshal(rec.Response, &res); err == nil && stillTrue(res, rec.Settlement) {
			res.Extensions = facilitator.ReplayInfo(p.PaymentID)
			return facilitator.SettleOutcome{Response: res, SettlementID: rec.Settlement.ID}, nil
		}
	}
	// The engine finds the settlement by its authorization, waits for it within the deadline, and
	// sends nothing: the settlement row exists.
	out, err := s.cfg.Settler.Settle(ctx, p)
	if err != nil {
		return out, err
	}
	return s.replayed(ctx, p, out), nil
}

// stillTrue says whether a stored answer still tells the settlement as it stands (read in the
// same statement as the answer). A success stands while the settlement is mined with the very
// transaction it named; a reorganisation that took it away (reopened, then canceled, settled by
// another, or mined again by a re-signed transaction) makes the replay the live answer again.
// Failures are stored only once terminal, on evidence read in final blocks: they stand.
func stillTrue(res facilitator.SettleResponse, st *facilitator.Settlement) bool {
	if !res.Success {
		return true
	}
	return st != nil && st.State.Succeeded() && st.ErrorReason == "" && st.TxHash.Hex() == res.Transaction
}

// replayed turns the engine's answer to a repeat of an id's request into that request's answer.
func (s *Service) replayed(ctx context.Context, p *facilitator.Payment, out facilitator.SettleOutcome) facilitator.SettleOutcome {
	res := &out.Response
	switch res.ErrorReason {
	case facilitator.ReasonAlreadySettled:
		// The success went to this id's first request; its retry is owed the same answer.
		*res = facilitator.SettleResponse{Success: true, Transaction: res.Transaction, Network: res.Network, Payer: res.Payer}
	case facilitator.ReasonSettlementPending:
		res.ErrorReason = facilitator.ReasonPaymentInFlight
		res.ErrorMessage = "the first request with this payment identifier is still settling; retry after Retry-After with the same payload"
	}
	s.rememberClaimed(ctx, p, out)
	res.Extensions = facilitator.ReplayInfo(p.PaymentID)
	return out
}

// rememberClaimed is remember, and for a claimed success stored under its id, the claim's
// confirmation: the id's retries answer the stored success from now on, so a crash before the
// answer is written leaves the success to them, not to a copy of the payload sent without the id.
// It reports what became of the answer.
func (s *Service) rememberClaimed(ctx context.Context, p *facilitator.Payment, out facilitator.SettleOutcome) remembered {
	stored := s.remember(ctx, p, out)
	if stored == kept && out.Claimed {
		if err := s.cfg.Settler.ConfirmDelivery(ctx, out); err != nil {
			s.log.Warn("confirming a success stored under its payment identifier", "payment_id", p.PaymentID, "err", err)
		}
	}
	return stored
}

// remembered is what became of an answer given under a payment id.
type remembered int

const (
	notKept remembered = iota // not an answer to keep (still settling), or the store failed
	kept                      // stored under the id
	refused                   // the id is not bound to the request that answered
)

// remember stores a settled answer under its id, for the window.
func (s *Service) remember(ctx context.Context, p *facilitator.Payment, out facilitator.SettleOutcome) remembered {
	res := out.Response
	if out.SettlementID == 0 || res.ErrorReason == facilitator.ReasonSettlementPending || res.ErrorReason == facilitator.ReasonPaymentInFlight {
		return notKept
	}
	res.Extensions = nil
	body, err := json.Marshal(res)
	if err != nil {
		return notKept
	}
	expires := s.cfg.Now().Add(s.cfg.Window)
	if vb := p.Authorization.ValidBefore; vb.IsInt64() {
		if floor := time.Unix(vb.Int64(), 0).Add(s.cfg.FinalityMargin); floor.After(expires) {
			expires = floor
		}
	} else if vb.Cmp(big.NewInt(0)) > 0 {
		expires = expires.Add(100 * 365 * 24 * time.Hour) // a validBefore past int64 seconds: keep it "forever"
	}
	stored, err := s.cfg.Store.StorePaymentResponse(context.WithoutCancel(ctx), p.IDScope, p.PaymentID, p.IDFingerprint(), p.Fingerprint(), body, expires)
	if err != nil {
		// The link stays: a retry rebuilds the answer from the ledger.
		s.log.Warn("storing a payment-identifier answer", "payment_id", p.PaymentID, "err", err)
		return notKept
	}
	if !stored {
		return refused
	}
	return kept
}

// Verify verifies p under its payment id. A payment already settled (or settling) under this id
// is valid, marked as a replay: after a lost response the official middleware verifies again
// before it serves and settles, and the used nonce must not turn the retry away.
func (s *Service) Verify(ctx context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error) {
	if p.PaymentID == "" {
		return s.cfg.Verifier.Verify(ctx, p)
	}
	rec, err := s.lookup(ctx, p)
	if err != nil {
		if facilitator.ErrorCode(err) == facilitator.EUnavailable {
			return facilitator.VerifyResponse{}, facilitator.Unavailable(facilitator.ReasonUnexpectedVerifyError, "the payment-identifier store is unavailable, retry", err)
		}
		return facilitator.VerifyResponse{}, err
	}
	if rec == nil {
		return s.cfg.Verifier.Verify(ctx, p)
	}
	s.replays.Add(1)
	st := rec.Settlement
	res := facilitator.VerifyResponse{Payer: p.Payer, Extensions: facilitator.ReplayInfo(p.PaymentID)}
	switch {
	case st.State.Open(), st.State.Succeeded() && st.ErrorReason == "":
		res.IsValid = true
	default:
		res.InvalidReason = st.ErrorReason
		if res.InvalidReason == "" {
			res.InvalidReason = facilitator.ReasonTransactionFailed
		}
		res.InvalidMessage = "the settlement made under this payment identifier failed: " + st.ErrorMessage
	}
	return res, nil
}

// conflict is the one answer to p reusing an id bound to another request (rec, nil when it could
// not be read; cause, the engine's ErrPaymentIDTaken when the insert found it bound): a client bug
// or a quote drift, so it is logged with what differs and counted.
func (s *Service) conflict(ctx context.Context, p *facilitator.Payment, rec *facilitator.PaymentIDRecord, cause error) error {
	s.conflicts.Add(1)
	msg := "this payment identifier is already bound to a different payment"
	if rec == nil {
		s.log.WarnContext(ctx, "payment identifier reused with a different payment",
			"payment_id", p.PaymentID, "payer", p.Payer, "conflicts_total", s.conflicts.Load())
		return &facilitator.Error{Code: facilitator.EConflict, Reason: facilitator.ReasonPaymentIdentifierConflict, Message: msg, Err: cause}
	}
	now := p.Summary()
	var differs []string
	for k, v := range now {
		// A field the record does not have (one stored before it was bound) is not what differs.
		if was, ok := rec.Summary[k]; ok && was != v {
			differs = append(differs, k)
		}
	}
	sort.Strings(differs)
	s.log.WarnContext(ctx, "payment identifier reused with a different payment",
		"payment_id", p.PaymentID, "first_payer", rec.Summary["from"], "payer", now["from"],
		"differs", strings.Join(differs, ","), "first_settlement", rec.Settlement.ID, "conflicts_total", s.conflicts.Load())
	return &facilitator.Error{Code: facilitator.EConflict, Reason: facilitator.ReasonPaymentIdentifierConflict,
		Message: msg + " (differs in: " + strings.Join(differs, ", ") + ")", Err: cause}
}

// ReleaseDelivery passes through to the settler.
func (s *Service) ReleaseDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	return s.cfg.Settler.ReleaseDelivery(ctx, out)
}

// Compact drops stored answers past their window, keeping the id→settlement links.
func (s *Service) Compact(ctx context.Context) (int64, error) {
	return s.cfg.Store.CompactPaymentIDs(ctx, s.cfg.Now())
}

// ConfirmDelivery passes through to the settler.
func (s *Service) ConfirmDelivery(ctx context.Context, out facilitator.SettleOutcome) error {
	return s.cfg.Settler.ConfirmDelivery(ctx, out)
}
