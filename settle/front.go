package settle

import (
	"context"
	"errors"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The /settle front door: Settle, and the waits and answers of its callers. See ARCHITECTURE.md
// "Following one /settle" for the whole walk, from Settle through the commit (commit.go) and
// the broadcast (broadcast.go) to the watcher's outcome.

// Settle settles p, or reports on the settlement already made for its authorization. The error is
// non-nil only when no answer about the payment can be given (bad request, ledger or node down,
// every signer busy, or facilitator.ErrPaymentIDTaken: p's payment id was bound to another request
// since the caller looked it up, a conflict the payment-identifier service words): then nothing
// was broadcast.
//
// A settlement the ledger holds is followed (follow). A new one: a key is picked (pickKey),
// verify's settle-path check runs, submitNew hands it to the key's sender (sender.submit: signed
// and committed to the ledger in commit.go, then handed to the broadcaster, broadcast.go), and
// the caller awaits its outcome (await).
func (e *Engine) Settle(ctx context.Context, p *facilitator.Payment) (facilitator.SettleOutcome, error) {
	if e.closed.Load() {
		return facilitator.SettleOutcome{}, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError,
			"this facilitator is shutting down; nothing was sent, retry", facilitator.ErrClosed)
	}
	id, err := e.verifier.Route(p)
	if err != nil {
		return facilitator.SettleOutcome{}, err
	}
	n := e.networks[id.ID]
	if n == nil {
		return facilitator.SettleOutcome{}, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork, "network %q has no settlement signers", p.Requirements.Network)
	}
	if p.Permit2 {
		return fail(p, facilitator.ReasonUnsupportedPayloadType, "Permit2 payloads are not supported by this facilitator", common.Hash{}), nil
	}
	waitCtx, cancel := context.WithTimeout(ctx, e.cfg.Deadline)
	defer cancel()
	key := facilitator.AuthorizationKey{Network: id.ID, Asset: p.Requirements.Asset, Payer: p.Authorization.From, Nonce: p.Authorization.Nonce}
	fp := p.Fingerprint()

	existing, err := e.store.SettlementByKey(waitCtx, key)
	switch {
	case err == nil:
		return e.follow(ctx, waitCtx, p, fp, existing)
	case !errors.Is(err, facilitator.ErrNotFound):
		return facilitator.SettleOutcome{}, ledgerDown(err)
	}

	s, err := e.pickKey(n)
	if err != nil {
		return facilitator.SettleOutcome{}, err
	}
	res, gas, wallet, err := e.verifier.SettleCheck(waitCtx, p, s.addr)
	if err != nil {
		return facilitator.SettleOutcome{}, err
	}
	if !res.IsValid {
		// Possibly ours, committed by a concurrent request (of this process or another) since the
		// lookup above: its transaction may even be mined already, and then the simulation
		// reverts ("authorization is used") rather than reporting the nonce used.
		if existing, err := e.store.SettlementByKey(waitCtx, key); err == nil {
			return e.follow(ctx, waitCtx, p, fp, existing)
		}
		if mayBeUsed(res.InvalidReason) {
			// Possibly used, and no row: perhaps by a transaction of our key whose row the ledger
			// lost (a failover, a restore). Then the payment moved, and it is adopted and followed.
			if out, ours, err := e.adoptUsed(ctx, waitCtx, n, p, key, fp); ours || err != nil {
				return out, err
			}
		}
		return fail(p, res.InvalidReason, res.InvalidMessage, common.Hash{}), nil
	}
	data := eip3009.TransferCalldata(p.Authorization, eip3009.SettlementSignature(p.Signature))
	s, f, err := e.submitNew(waitCtx, n, s, newRow(p, key, fp, e.cfg.Limits), data, gas, wallet)
	switch {
	case errors.Is(err, facilitator.ErrDuplicate):
		existing, err := e.store.SettlementByKey(waitCtx, key)
		if err != nil {
			return facilitator.SettleOutcome{}, ledgerDown(err)
		}
		return e.follow(ctx, waitCtx, p, fp, existing)
	case facilitator.ErrorCode(err) == facilitator.ELimited:
		e.log.Info("settlement refused by a limit; nothing was sent", "network", id.ID, "payer", key.Payer,
			"nonce", hexutil.Encode(key.Nonce[:]), "api_key", p.KeyID, "reason", facilitator.ErrorReason(err, ""))
		return facilitator.SettleOutcome{}, err
	case err != nil:
		return facilitator.SettleOutcome{}, err
	}
	e.log.Info("settlement signed", f.logAttrs("network", id.ID, "signer", s.addr, "tx_nonce", f.txNonce(), "tx", f.view().hash)...)
	return e.await(ctx, waitCtx, p, f), nil
}

// mayBeUsed reports whether a payment verify refused for reason may have been transferred
// already: the authorization used (verify names that first only while validBefore is ahead),
// expired, the payer's balance short (moved by that transfer), or a simulation that failed.
func mayBeUsed(reason string) bool {
	switch reason {
	case facilitator.ReasonNonceAlreadyUsed, facilitator.ReasonValidBefore, facilitator.ReasonInsufficientBalance, facilitator.ReasonSimulationFailed:
		return true
	}
	return false
}

// newRow is the ledger row of p's new settlement before it is signed: the sender fills in the
// key, the nonce and the transaction (commit.go).
func newRow(p *facilitator.Payment, key facilitator.AuthorizationKey, fp facilitator.Fingerprint, limits facilitator.Limits) *facilitator.NewSettlement {
	row := &facilitator.NewSettlement{
		Key: key, Fingerprint: fp, PayTo: p.Authorization.To, Value: p.Authorization.Value,
		ValidAfter: p.Authorization.ValidAfter, ValidBefore: p.Authorization.ValidBefore,
		X402Version: p.X402Version, Request: p.Body,
	}
	if row.Request == nil {
		row.Request = []byte("{}")
	}
	if p.PaymentID != "" {
		row.PaymentID = &facilitator.PaymentIDBinding{Scope: p.IDScope, ID: p.PaymentID, Fingerprint: p.IDFingerprint(), Summary: p.Summary()}
	}
	row.KeyID, row.Limits = p.KeyID, limits
	return row
}

// pickKey is the key of n a new settlement is signed with (pickSender), or why there is none:
// nothing was sent.
func (e *Engine) pickKey(n *chainEngine) (*sender, error) {
	if s := n.pickSender(); s != nil {
		return s, nil
	}
	if n.allRetiring() {
		// Not a wait that passes: the operator retired every key without adding one.
		return nil, &facilitator.Error{Code: facilitator.EUnavailable, Reason: facilitator.ReasonSignersRetiring,
			Message: "every settlement signer of this network is retiring and takes no new settlement; nothing was sent (the operator must add a signer key that is not retiring)"}
	}
	if n.usable() == 0 {
		return nil, facilitator.Unavailable(facilitator.ReasonSettlerBusy,
			"no settlement signer of this network that takes new settlements is held by this instance right now (another instance holds them); nothing was sent, retry shortly", nil)
	}
	if n.allLow() {
		// The operator was alerted (balance.go); the balance is read again every BalanceInterval.
		return nil, &facilitator.Error{Code: facilitator.EUnavailable, Reason: facilitator.ReasonInsufficientSignerFunds,
			Message:    "every settlement signer of this network is below its minimum balance for gas; nothing was sent, retry later",
			RetryAfter: e.cfg.BalanceInterval}
	}
	return nil, facilitator.Unavailable(facilitator.ReasonSettlerBusy, "every settlement signer is at its in-flight limit; nothing was sent, retry shortly", nil)
}

// submitNew hands row's settlement to s (sender.submit): it returns once the row is committed
// and its transaction handed to the broadcaster, or with why nothing was sent. A key handed to
// another process between the pick and the commit signed nothing: another key of this process's
// takes the payment. It returns the sender that took it.
func (e *Engine) submitNew(waitCtx context.Context, n *chainEngine, s *sender, row *facilitator.NewSettlement, data []byte, gas uint64, wallet bool) (*sender, *flight, error) {
	for tries := 0; ; tries++ {
		f, err := s.submit(waitCtx, row, row.Key.Asset, data, gas, wallet)
		if !errors.Is(err, errNotLeased) || tries >= len(n.senders) {
			return s, f, err
		}
		if s, err = e.pickKey(n); err != nil {
			return nil, nil, err
		}
	}
}

// follow answers a request for an authorization that already has a settlement.
func (e *Engine) follow(ctx, waitCtx context.Context, p *facilitator.Payment, fp facilitator.Fingerprint, s *facilitator.Settlement) (facilitator.SettleOutcome, error) {
	if s.Adopted && s.Fingerprint == (facilitator.Fingerprint{}) && adoptedTerms(s, p) {
		// Adopted from the chain with no request (the reconcile job found it): the first request
		// for its authorization with its terms is the one that made it, and takes it.
		if _, err := e.store.BindAdopted(waitCtx, s.ID, fp, p.KeyID, p.X402Version, p.Body); err != nil {
			return facilitator.SettleOutcome{}, ledgerDown(err)
		}
		next, err := e.store.SettlementByID(waitCtx, s.ID)
		if err != nil {
			return facilitator.SettleOutcome{}, ledgerDown(err)
		}
		s = next
	}
	if s.Fingerprint != fp {
		// Someone else's request for the same authorization (a different signature or requirements):
		// it gets no success and does not wait.
		return fail(p, facilitator.ReasonNonceAlreadyUsed, "this authorization is already being settled from a different request", s.TxHash), nil
	}
	e.watchAdopted(waitCtx, s)
	if f := e.flight(s.ID); f != nil {
		return e.await(ctx, waitCtx, p, f), nil
	}
	// Not ours in memory: another process's, or resolved.
	return e.poll(ctx, waitCtx, p, s)
}

// adoptedTerms reports whether p asks for what the adopted row's transaction did: the payee and
// the amount its authorization names (the payer and nonce are the row's key).
func adoptedTerms(s *facilitator.Settlement, p *facilitator.Payment) bool {
	a := p.Authorization
	return a.To == s.PayTo && a.Value != nil && s.Value != nil && a.Value.Cmp(s.Value) == 0 &&
		a.ValidBefore != nil && s.ValidBefore != nil && a.ValidBefore.Cmp(s.ValidBefore) == 0
}

// poll reads the ledger every PollInterval until the settlement is settled or the deadline passes
// (a stepped engine reads it once: run.pause).
func (e *Engine) poll(ctx, waitCtx context.Context, p *facilitator.Payment, s *facilitator.Settlement) (facilitator.SettleOutcome, error) {
	for !s.State.Succeeded() && s.State.Open() && e.run.pause(waitCtx, e.cfg.PollInterval) {
		next, err := e.store.SettlementByID(waitCtx, s.ID)
		if err != nil {
			if waitCtx.Err() != nil {
				return e.answer(ctx, waitCtx, p, viewOf(s)), nil
			}
			return facilitator.SettleOutcome{}, ledgerDown(err)
		}
		s = next
	}
	return e.answer(ctx, waitCtx, p, viewOf(s)), nil
}

func viewOf(s *facilitator.Settlement) view {
	return view{id: s.ID, state: s.State, hash: s.TxHash, block: s.BlockNumber, reason: s.ErrorReason, message: s.ErrorMessage, delivered: s.Delivered}
}

// await answers the caller of f, this process's settlement: the live engine waits for its
// outcome (waitOutcome), a stepped one answers with what is known now (run.go).
func (e *Engine) await(ctx, waitCtx context.Context, p *facilitator.Payment, f *flight) facilitator.SettleOutcome {
	return e.run.await(ctx, waitCtx, p, f)
}

// waitOutcome waits for f's outcome within the deadline. When this process loses f's key
// meanwhile, the key's next holder finishes f: the answer then comes from the ledger.
func (e *Engine) waitOutcome(ctx, waitCtx context.Context, p *facilitator.Payment, f *flight) facilitator.SettleOutcome {
	// The first caller to wait offers its claim of the success, so that the watcher writes it
	// with the mined outcome (one row update for both) instead of a statement of the caller's.
	token := e.claimToken(f.id)
	offered := ctx.Err() == nil && f.offerClaim(p.KeyID, token)
	v := f.wait(waitCtx, func(v view) bool { return settled(v) || v.dropped })
	var claimed []byte
	took, at := false, time.Time{}
	if offered {
		took, at = f.takeClaim(token)
	}
	if took {
		claimed = token
	}
	if !v.dropped || settled(v) {
		return e.answerClaimed(ctx, waitCtx, p, v, claimed, at)
	}
	if claimed != nil {
		e.release(ctx, f.id, claimed) // not answered from this view: the poll below claims afresh
	}
	s, err := e.store.SettlementByID(waitCtx, f.id)
	if err != nil {
		return e.answer(ctx, waitCtx, p, v) // open: pending with the hash; the caller asks again
	}
	out, err := e.poll(ctx, waitCtx, p, s)
	if err != nil {
		return e.answer(ctx, waitCtx, p, v)
	}
	return out
}

// answer turns a settlement's state into the caller's answer. Success goes to exactly one caller:
// the first with the settlement's own API key to claim it while still connected.
// While another caller's claim of the success is undecided, it asks again every PollInterval
// within waitCtx: the claim is confirmed (already settled), given back, or its lease ends (its
// process died: the success is this caller's), and the official resource server, which retries
// a pending answer once without waiting, gets the outcome.
func (e *Engine) answer(ctx, waitCtx context.Context, p *facilitator.Payment, v view) facilitator.SettleOutcome {
	return e.answerClaimed(ctx, waitCtx, p, v, nil, time.Time{})
}

// answerClaimed is answer for a caller whose claim the ledger already recorded (with the mined
// outcome, in a write begun at at; token claimed, nil when none): it is answered with it, or,
// when the answer is not the success (the caller left, the settlement was reorganised meanwhile),
// gives it back.
func (e *Engine) answerClaimed(ctx, waitCtx context.Context, p *facilitator.Payment, v view, claimed []byte, at time.Time) facilitator.SettleOutcome {
	out, undecided := e.answerWith(ctx, p, v, claimed, at)
	if claimed != nil && !out.Claimed {
		e.release(ctx, v.id, claimed)
	}
	for undecided && e.run.pause(waitCtx, e.cfg.PollInterval) {
		out, undecided = e.answerWith(ctx, p, v, nil, time.Time{}) // v is mined: only the claim is asked again
	}
	if out.Claimed {
		e.hold(out)
		// The claim is recorded and the answer not written: a crash here must not lose the
		// success (the claim's lease ends unconfirmed, and the next identical request gets it).
		e.fault(FaultAfterClaim)
	}
	return out
}

// answerWith is one answer; undecided: it is pending only because another caller's claim of the
// success is undecided.
func (e *Engine) answerWith(ctx context.Context, p *facilitator.Payment, v view, claimed []byte, at time.Time) (out facilitator.SettleOutcome, undecided bool) {
	out = facilitator.SettleOutcome{SettlementID: v.id}
	switch {
	case v.state.Open():
		out.Response = fail(p, facilitator.ReasonSettlementPending,
			"the transaction is broadcast and has no receipt yet; send the same payload again for its outcome (do not sign a new authorization)", v.hash).Response
	case v.state.Succeeded() && v.reason != "":
		out.Response = fail(p, v.reason, v.message, v.hash).Response
	case v.state.Succeeded():
		if ctx.Err() == nil && claimed != nil {
			out.Claimed, out.Claim, out.ClaimBy = true, claimed, at.Add(e.cfg.ClaimLease/2)
		} else if ctx.Err() == nil && e.answeredHere(v.id) {
			// This process wrote the success to an earlier caller; its confirmation is on its way.
		} else if ctx.Err() == nil {
			// Not the caller's context: a claim the ledger made must come back to be released if
			// the caller leaves meanwhile. Bounded all the same, so a ledger that does not answer
			// turns into a pending answer instead of a hung request.
			claim := e.claimToken(v.id)
			at := e.now() // before the write: the lease begins after it
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
			claimed, err := e.store.ClaimDelivery(cctx, v.id, p.KeyID, claim, e.cfg.ClaimLease)
			cancel()
			if errors.Is(err, facilitator.ErrClaimUndecided) && !e.answeredHere(v.id) && e.awaitHeld(ctx, v.id) {
				// This process's own caller's answer was being written: now it is decided.
				at = e.now()
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
				claimed, err = e.store.ClaimDelivery(cctx, v.id, p.KeyID, claim, e.cfg.ClaimLease)
				cancel()
			}
			if errors.Is(err, facilitator.ErrClaimUndecided) && !e.answeredHere(v.id) {
				// Another caller's claim: its answer is being written, or its process died before
				// it did and the success comes to a retry once the claim's lease ends. Nothing was
				// written for this one.
				out.Response = fail(p, facilitator.ReasonSettlementPending,
					"the transfer is mined and another request's answer of its success is undecided; send the same payload again for the answer", v.hash).Response
				return out, true
			}
			if errors.Is(err, facilitator.ErrClaimUndecided) {
				err = nil // answered here meanwhile: already settled
			}
			if err != nil {
				// The claim may have committed all the same: then nobody would ever be told the
				// success. It is released (this claim only) before the caller, told pending,
				// asks again.
				e.log.Warn("claiming a success; answering pending", "settlement", v.id, "payer", p.Payer,
					"nonce", hexutil.Encode(p.Authorization.Nonce[:]), "tx", v.hash, "err", err)
				e.release(ctx, v.id, claim)
				out.Response = fail(p, facilitator.ReasonSettlementPending, "the transfer is mined; send the same payload again for the answer", v.hash).Response
				return out, false
			}
			out.Claimed, out.Claim = claimed, claim
			if claimed {
				out.ClaimBy = at.Add(e.cfg.ClaimLease / 2)
			}
		}
		if out.Claimed {
			out.Response = facilitator.SettleResponse{Success: true, Transaction: v.hash.Hex(), Network: p.Network, Payer: p.Payer}
		} else {
			out.Response = fail(p, facilitator.ReasonAlreadySettled,
				"this authorization was already settled and its success answered to an earlier request", v.hash).Response
		}
	case v.state == facilitator.StateCanceled:
		out.Response = fail(p, facilitator.ReasonNonceAlreadyUsed, "the authorizer canceled the authorization", common.Hash{}).Response
	case v.state == facilitator.StateSettledElsewhere:
		out.Response = fail(p, facilitator.ReasonNonceAlreadyUsed, "the authorization was used by a transaction that is not ours", common.Hash{}).Response
	default:
		out.Response = fail(p, orDefault(v.reason, facilitator.ReasonTransactionFailed), v.message, v.hash).Response
	}
	return out, false
}

func fail(p *facilitator.Payment, reason, message string, tx common.Hash) facilitator.SettleOutcome {
	r := facilitator.SettleResponse{Success: false, ErrorReason: reason, ErrorMessage: message, Network: p.Network, Payer: p.Payer}
	if tx != (common.Hash{}) {
		r.Transaction = tx.Hex()
	}
	return facilitator.SettleOutcome{Response: r}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func ledgerDown(err error) error {
	return facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "the settlement ledger is unavailable; nothing was sent, retry", err)
}
