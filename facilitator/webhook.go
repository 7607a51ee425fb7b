package facilitator

import (
	"errors"
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
	// Owner is the webhook's owner (an API key id; "" in open mode): whose share it takes.
	Owner  string
	URL    string
	Secret string
	Event  SettlementEvent
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
	// Deferred marks an attempt never made (its endpoint's circuit breaker was open): the claim's
	// attempt is given back and the delivery is due again after RetryIn.
	Deferred bool
}

// DeliveryClaim is what one claim of due webhook deliveries may take: the fair shares of the
// delivery slots.
type DeliveryClaim struct {
	// Limit is how many deliveries to take at most (the free slots).
	Limit int
	// PerWebhook and PerOwner cap the deliveries of one webhook, and of one owner's webhooks
	// together, in flight at once: those already in flight (BusyWebhooks by webhook id,
	// BusyOwners by owner) count against them.
	PerWebhook, PerOwner     int
	BusyWebhooks, BusyOwners map[string]int
	// Skip lists webhooks whose deliveries are not to be taken now (their endpoint is failing).
	Skip []string
	// Lease is how long a claimed attempt stays hidden from other claimers.
	Lease time.Duration
}

// A redelivery (an operator's or the webhook owner's) is refused for a delivery that was not
// given up (delivered, or still being tried: it is already due) and for a disabled webhook's.
var (
	ErrDeliveryNotGivenUp = errors.New("the delivery was not given up: it was delivered, or is still being tried")
	ErrWebhookDisabled    = errors.New("the webhook is disabled: nothing is sent to it")
)
