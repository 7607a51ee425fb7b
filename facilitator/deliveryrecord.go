package facilitator

import "time"

// DeliveryRecord is what a merchant says it served for a settled payment, recorded once by the API key
// that made the settlement: the SHA-256 of the response body, and optionally its content type and
// size. A payer holding the response can hash it and compare, proving which answer it paid for;
// the record is the merchant's word, shown beside (never instead of) what the chain shows.
type DeliveryRecord struct {
	// SHA256 is the response body's digest, 0x-prefixed lowercase hex (32 bytes).
	SHA256      string    `json:"sha256"`
	ContentType string    `json:"contentType,omitempty"`
	Size        *int64    `json:"size,omitempty"`
	RecordedAt  time.Time `json:"recordedAt"`
}
