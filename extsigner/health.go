package extsigner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"
)

// Why a remote signer did not sign: SignError's Reason, and the refusals metric's label.
const (
	// ReasonUnreachable: no answer at all (connection refused, DNS, a proxy's 5xx).
	ReasonUnreachable = "unreachable"
	// ReasonTimeout: no answer within the call's bound.
	ReasonTimeout = "timeout"
	// ReasonUnauthorized: the signer wants a password the URL does not carry (HTTP 401/403).
	ReasonUnauthorized = "unauthorized"
	// ReasonWrongChain: the signer signs for another chain id than the network's.
	ReasonWrongChain = "wrong_chain"
	// ReasonUnknownKey: the signer holds no key of the address asked for.
	ReasonUnknownKey = "unknown_key"
	// ReasonRefused: the signer answered and refused (its policy, its rules, its window).
	ReasonRefused = "refused"
	// ReasonBadAnswer: what the signer answered is not a transaction of the key for the chain.
	ReasonBadAnswer = "bad_answer"
)

// Reasons are every Reason*, in a fixed order.
var Reasons = []string{ReasonUnreachable, ReasonTimeout, ReasonUnauthorized, ReasonWrongChain, ReasonUnknownKey, ReasonRefused, ReasonBadAnswer}

// SignError is a remote signer's failure to sign, with why (a Reason*). Its text never carries
// the URL's credentials.
type SignError struct {
	Reason string
	msg    string
}

func (e *SignError) Error() string { return e.msg }

// down reports whether the reason means the key cannot sign anything now (rather than that the
// signer refused one transaction).
func down(reason string) bool { return reason != ReasonRefused }

// classify is why err, an account_* call's failure, happened.
func classify(err error) string {
	var (
		re rpc.Error
		he rpc.HTTPError
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.As(err, &he):
		if he.StatusCode == 401 || he.StatusCode == 403 {
			return ReasonUnauthorized
		}
		return ReasonUnreachable
	case errors.As(err, &re):
		msg := strings.ToLower(re.Error())
		switch {
		// The narrow signer's words (Policy.Check, Server.Sign), then Clef's.
		case strings.Contains(msg, "is not this signer's chain"), strings.Contains(msg, "does not match the configuration of the signer"):
			return ReasonWrongChain
		case strings.Contains(msg, "is not an account of this signer"), strings.Contains(msg, "unknown account"):
			return ReasonUnknownKey
		}
		return ReasonRefused
	}
	return ReasonUnreachable
}

// signError is err of the call method, classified, its text scrubbed.
func (e *Endpoint) signError(method string, err error) *SignError {
	return &SignError{Reason: classify(err), msg: fmt.Sprintf("remote signer %s: %s: %s", e.where, method, scrub(err))}
}

// probeNonce is the probe transaction's nonce: no account ever reaches it, so a probe that a
// signer does sign (a Clef whose rules approve it) can never be mined, whoever holds it.
const probeNonce = math.MaxUint64 - 1

// ProbeCode is the JSON-RPC error code the narrow signer answers a probe with: it holds the key
// and signs for the chain asked, and signed nothing.
const ProbeCode = -32040

// probeTx is the probe of from's key: nothing sent to itself, at a fee of zero and a nonce never
// reached.
func probeTx(from common.Address) *types.DynamicFeeTx {
	return &types.DynamicFeeTx{Nonce: probeNonce, Gas: 21_000, GasTipCap: new(big.Int), GasFeeCap: new(big.Int), To: &from}
}

// isProbe reports whether args are probeTx's.
func isProbe(args *apitypes.SendTxArgs) bool {
	data := args.Input
	if data == nil {
		data = args.Data
	}
	return uint64(args.Nonce) == probeNonce && args.To != nil && args.To.Address() == args.From.Address() &&
		args.Value.ToInt().Sign() == 0 && (data == nil || len(*data) == 0)
}

// probeAnswer is the narrow signer's answer to a probe that passed its key and chain checks.
type probeAnswer struct{ chainID uint64 }

func (p probeAnswer) Error() string {
	return fmt.Sprintf("probe: this signer holds the key and signs for chain %d (nothing was signed)", p.chainID)
}

// ErrorCode is the JSON-RPC error code (go-ethereum's rpc.Error).
func (probeAnswer) ErrorCode() int { return ProbeCode }

// Probe asks the signer, within ctx, whether it answers, holds addr's key and signs for the
// endpoint's chain, without anything being signed that could be mined: it asks for a probe
// transaction (nothing to itself, at a fee of zero and a nonce no account reaches), which the
// narrow signer checks like a settlement's key and chain and then declines (ProbeCode), and a
// Clef checks for its chain id before its rules decide. The error is a *SignError. The answer
// is recorded in the key's health.
func (e *Endpoint) Probe(ctx context.Context, addr common.Address) error {
	err := e.probe(ctx, addr)
	e.record(addr, err, false)
	if err != nil {
		return err
	}
	return nil
}

func (e *Endpoint) probe(ctx context.Context, addr common.Address) *SignError {
	var res signResult
	err := e.rpc.CallContext(ctx, &res, "account_signTransaction", Args(addr, e.chainID, probeTx(addr)))
	if err == nil {
		// A signer whose rules approve it signed the probe: it must be the key's, for the chain.
		tx := new(types.Transaction)
		if err := tx.UnmarshalBinary(res.Raw); err != nil {
			return &SignError{Reason: ReasonBadAnswer, msg: fmt.Sprintf("remote signer %s: the signed probe does not decode: %v", e.where, err)}
		}
		if tx.ChainId().Cmp(e.chainID) != 0 {
			return &SignError{Reason: ReasonWrongChain, msg: fmt.Sprintf("remote signer %s: signed for chain %s, not %s", e.where, tx.ChainId(), e.chainID)}
		}
		if from, err := types.Sender(types.LatestSignerForChainID(e.chainID), tx); err != nil || from != addr {
			return &SignError{Reason: ReasonUnknownKey, msg: fmt.Sprintf("remote signer %s: signed with another key than %s", e.where, addr)}
		}
		return nil
	}
	var re rpc.Error
	if errors.As(err, &re) && re.ErrorCode() == ProbeCode {
		return nil
	}
	se := e.signError("account_signTransaction", err)
	if se.Reason != ReasonRefused {
		return se
	}
	// Refused after the chain check, which both signers make first (and the narrow signer its
	// key check before it): a Clef's rules deny the probe before it looks for the key, so the
	// key is looked for in its list.
	if strings.Contains(strings.ToLower(se.msg), "denied") {
		addrs, err := e.Accounts(ctx)
		switch {
		case err != nil:
			return &SignError{Reason: ReasonRefused, msg: fmt.Sprintf("%s; and its account_list: %v", se.msg, err)}
		case !slices.Contains(addrs, addr):
			return &SignError{Reason: ReasonUnknownKey, msg: fmt.Sprintf("remote signer %s: its account_list does not hold %s", e.where, addr)}
		}
	}
	return nil
}

// KeyHealth is what the last contact with one remote key said.
type KeyHealth struct {
	Address common.Address
	// Known: the key was contacted (probed or asked to sign) at least once; nothing else is
	// meaningful before.
	Known bool
	// Up: the last contact answered, for the chain and the key (a refusal of one transaction by
	// the signer's policy leaves it up).
	Up bool
	// State is "ok" or the last failure's text (no credentials), and At when it was seen.
	State string
	At    time.Time
	// LastSigned is when the key last signed a transaction (zero: never, in this process).
	LastSigned time.Time
	// Refusals counts the transactions the signer did not sign, by reason (probes are not
	// counted): every Reason* is present.
	Refusals map[string]uint64
}

// health is an endpoint's keys' health; the zero value is empty.
type health struct {
	mu   sync.Mutex
	keys map[common.Address]*KeyHealth
}

// key is addr's entry, made on first use. The caller holds mu.
func (h *health) key(addr common.Address) *KeyHealth {
	if h.keys == nil {
		h.keys = map[common.Address]*KeyHealth{}
	}
	k := h.keys[addr]
	if k == nil {
		k = &KeyHealth{Address: addr, Refusals: map[string]uint64{}}
		for _, r := range Reasons {
			k.Refusals[r] = 0
		}
		h.keys[addr] = k
	}
	return k
}

// record notes a contact with addr's key at now: err nil (a *SignError otherwise); signing
// tells a transaction the engine asked for from a probe.
func (e *Endpoint) record(addr common.Address, err *SignError, signing bool) {
	now := e.now()
	e.health.mu.Lock()
	defer e.health.mu.Unlock()
	k := e.health.key(addr)
	k.Known, k.At = true, now
	if err == nil {
		k.Up, k.State = true, "ok"
		if signing {
			k.LastSigned = now
		}
		return
	}
	k.State = err.Error()
	k.Up = !down(err.Reason)
	if signing {
		k.Refusals[err.Reason]++
	}
}

// Health is the health of the endpoint's keys (those Signer made, and any probed), by address.
func (e *Endpoint) Health() []KeyHealth {
	e.health.mu.Lock()
	defer e.health.mu.Unlock()
	out := make([]KeyHealth, 0, len(e.health.keys))
	for _, k := range e.health.keys {
		c := *k
		c.Refusals = make(map[string]uint64, len(k.Refusals))
		for r, n := range k.Refusals {
			c.Refusals[r] = n
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b KeyHealth) int { return a.Address.Cmp(b.Address) })
	return out
}
