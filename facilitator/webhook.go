package facilitator

import (
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// The webhook rows: merchants' endpoints, the settlement events sent to them, and each
// delivery attempt.

// Webhook is a merchant's registered endpoint.
type Webhook struct {
	ID  string
	URL string
	// Secret is the HMAC key; only set when the webhook is created (it is never listed).
	Secret string
	// PayTo limits the webhook to settlements paying one of these addresses; empty: all.
	PayTo     []common.Address
	CreatedAt time.Time
	// Owner is the id of the merchant API key that registered it; "" in open mode. Only its
	// owner lists or deletes it.
	Owner string
}

// SettlementEvent is one state transition of a settlement (a settlement_events row).
type SettlementEvent struct {
	ID           int64
	SettlementID int64
	State        State
	At           time.Time
}

// WebhookDelivery is one claimed attempt to send an event to a webhook.
type WebhookDelivery struct {
	WebhookID string
	URL       string
	Secret    string
	Event     SettlementEvent
	// Attempt counts this one: 1 for the first.
	Attempt int
	// Key is the settlement's authorization, to read its status at delivery time.
	Key AuthorizationKey
	// PaymentID is the settlement's payment-identifier id, if it came with one.
	PaymentID string
}

// DeliveryAttempt is the outcome of one delivery attempt.
type DeliveryAttempt struct {
	WebhookID string
	EventID   int64
	Delivered bool
	// HTTPStatus is the receiver's HTTP status; 0 when it did not answer.
	HTTPStatus int
	Error      string
	// RetryIn is when to try again (after a failure that is not the last).
	RetryIn time.Duration
	// GiveUp marks the last failed attempt: nothing more is sent.
	GiveUp bool
}
