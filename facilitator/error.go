package facilitator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Code is the category of an error: it decides the HTTP status in api/, while Reason carries the
// x402 reason string that goes into the body.
type Code string

const (
	// EInvalid: the request cannot be processed as sent (400). Nothing was changed.
	EInvalid Code = "invalid"
	// EUnauthenticated: the request carries no usable credentials (401).
	EUnauthenticated Code = "unauthenticated"
	// EForbidden: the credentials do not allow this request (403). Nothing was changed.
	EForbidden Code = "forbidden"
	// ENotFound: nothing is known under the key the request names (404).
	ENotFound Code = "not_found"
	// EConflict: the request contradicts an earlier one (409).
	EConflict Code = "conflict"
	// ELimited: a configured limit refuses the request for now (429); nothing was changed, and
	// RetryAfter says when the same request may pass.
	ELimited Code = "limited"
	// EUnavailable: a dependency (RPC node, Postgres) failed; the outcome is unknown, retry later (503).
	EUnavailable Code = "unavailable"
	// EInternal: a bug or an unclassified failure (500).
	EInternal Code = "internal"
)

// Error is the one error type of the domain. Message is safe to show to a caller; Err is the
// underlying cause, for logs only.
type Error struct {
	Code    Code
	Reason  string
	Message string
	Err     error
	// RetryAfter is how long the caller should wait before sending the request again; zero leaves
	// it to the API's default for the code.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	msg := e.Reason
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an Error with a formatted caller-safe message.
func Errorf(code Code, reason, format string, args ...any) *Error {
	return &Error{Code: code, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Unavailable wraps a dependency failure; the cause stays out of the caller-facing message.
func Unavailable(reason, message string, err error) *Error {
	return &Error{Code: EUnavailable, Reason: reason, Message: message, Err: err}
}

// Bounded is err, from a read made under ctx's bound, as its caller answers it: when the bound
// passed, a clear ReasonStatusTimeout (503) whatever the layers below made of the deadline (an
// untyped error would answer 500, a status_unavailable would not say the read was cut short).
// A nil err, or one while the bound still holds, is returned as is.
func Bounded(ctx context.Context, err error) error {
	if err == nil || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return err
	}
	return &Error{Code: EUnavailable, Reason: ReasonStatusTimeout,
		Message: "the lookup did not finish in time (the node or the ledger is not answering); nothing changed, retry", Err: err}
}

// ErrorCode returns the category of err; an untyped error is internal.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EInternal
}

// ErrorReason returns the x402 reason of err, or fallback for an untyped error.
func ErrorReason(err error, fallback string) string {
	var e *Error
	if errors.As(err, &e) && e.Reason != "" {
		return e.Reason
	}
	return fallback
}

// ErrorRetryAfter returns how long the caller of err should wait before retrying; zero: no advice.
func ErrorRetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// ErrorMessage returns the caller-safe message of err. Untyped errors never leak their text,
// since it may carry RPC URLs or other configuration.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// Sentinels the ledger returns and the engine tests for.
var (
	// ErrNotFound: no such row.
	ErrNotFound = errors.New("not found")
	// ErrDuplicate: a settlement for this authorization already exists.
	ErrDuplicate = errors.New("a settlement for this authorization already exists")
	// ErrClaimUndecided: another caller's claim of the success is not confirmed yet, and its lease
	// has not ended: that caller's answer may be being written, or its process died before it.
	ErrClaimUndecided = errors.New("another request's success claim is undecided")
	// ErrNonceTaken: the signer's transaction nonce already belongs to another settlement, so the
	// allocator's view of the signer is stale.
	ErrNonceTaken = errors.New("transaction nonce already used by another settlement")
)

// ErrClosed is what a service (the settlement engine, an indexer) answers once it is stopped:
// nothing was done, and it does not start again. Its loops' context is canceled with it as the
// cause, so a loop's log says why it ended.
var ErrClosed = errors.New("the service is stopped")

// StripURLs is msg with every URL (http, https, ws, wss) replaced by "<url>": transport errors
// quote the request URL, whose path or query often holds a provider's API key, and a text kept
// or shown (a log line, a recorded job error) must not carry it.
func StripURLs(msg string) string {
	for _, scheme := range []string{"https://", "http://", "wss://", "ws://", "postgres://", "postgresql://"} {
		for {
			i := strings.Index(msg, scheme)
			if i < 0 {
				break
			}
			j := i + len(scheme)
			for j < len(msg) && msg[j] != ' ' && msg[j] != '"' && msg[j] != '\'' {
				j++
			}
			msg = msg[:i] + "<url>" + msg[j:]
		}
	}
	return msg
}
