package client_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestPrintStatus pins what 'facilitator status' prints for a person: only the fields the answer
// has, the state's advice, and the note when only the chain knows the authorization.
func TestPrintStatus(t *testing.T) {
	size := int64(57)
	for _, c := range []struct {
		name  string
		st    facilitator.AuthorizationStatus
		found bool
		want  string
	}{
		{"settled", facilitator.AuthorizationStatus{State: "settled", SettledBy: "facilitator", Network: "eip155:31337", Asset: "0xA", Authorizer: "0xB", Nonce: "0x01",
			Transaction: "0xT", BlockNumber: 20, Confirmations: 3, Final: true, To: "0xC", Value: "10000", PaymentID: "pay_1", Basis: "ledger", IndexedHead: 21, Head: 22,
			Finality: facilitator.StatusFinality{Rule: "tag:finalized", FinalBlock: 20}}, true,
			`state         settled (by facilitator)
meaning       the payment happened
authorization eip155:31337 0xA from 0xB nonce 0x01
payment id    pay_1
transaction   0xT
block         20 (3 confirmations, final)
finality      tag:finalized, final up to block 20
paid          10000 to 0xC
read from     ledger, indexed head 21, chain head 22
`},
		{"delivered", facilitator.AuthorizationStatus{State: "settled", SettledBy: "facilitator", Network: "eip155:1", Asset: "0xA", Authorizer: "0xB", Nonce: "0x01",
			Transaction: "0xT", Basis: "ledger", Delivery: &facilitator.DeliveryRecord{SHA256: "0xab", ContentType: "application/json", Size: &size,
				RecordedAt: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}}, true,
			`state         settled (by facilitator)
meaning       the payment happened
authorization eip155:1 0xA from 0xB nonce 0x01
transaction   0xT
delivered     sha256 0xab, application/json, 57 bytes, recorded 2026-12-03T12:00:00Z by the merchant
read from     ledger, indexed head 0, chain head 0
`},
		{"unseen", facilitator.AuthorizationStatus{State: "unused", Network: "eip155:1", Asset: "0xA", Authorizer: "0xB", Nonce: "0x02", Basis: "chain", Head: 5}, false,
			`state         unused
meaning       nothing has moved; it can still be settled until validBefore
note          never seen by this facilitator's ledger or index: this is the chain's own answer
authorization eip155:1 0xA from 0xB nonce 0x02
read from     chain, indexed head 0, chain head 5
`},
		{"failed", facilitator.AuthorizationStatus{State: "failed", Network: "eip155:1", Asset: "0xA", Authorizer: "0xB", Nonce: "0x02", BlockNumber: 7, Confirmations: 1,
			Reason: "invalid_exact_evm_transaction_failed", Basis: "ledger", Finality: facilitator.StatusFinality{Rule: "depth:12"}}, true,
			`state         failed
meaning       our transaction reverted; nothing moved
authorization eip155:1 0xA from 0xB nonce 0x02
block         7 (1 confirmations, not final yet)
finality      depth:12, no block known final
reason        invalid_exact_evm_transaction_failed
read from     ledger, indexed head 0, chain head 0
`},
		{"batch", facilitator.AuthorizationStatus{State: "settled", SettledBy: "facilitator", Network: "eip155:1", Asset: "0xA", Authorizer: "0xB", Nonce: "0x01",
			Transaction: "0xT", Basis: "ledger", Batch: []facilitator.BatchSettlement{
				{Network: "eip155:1", Asset: "0xA", Authorizer: "0xB", Nonce: "0x01", State: "settled", Status: "/v1/authorizations/eip155:1/0xA/0xB/0x01"},
				{Network: "eip155:1", Asset: "0xA", Authorizer: "0xD", Nonce: "0x02", State: "failed", Reason: "batch_call_failed", Status: "/v1/authorizations/eip155:1/0xA/0xD/0x02"},
			}}, true,
			`state         settled (by facilitator)
meaning       the payment happened
authorization eip155:1 0xA from 0xB nonce 0x01
transaction   0xT
read from     ledger, indexed head 0, chain head 0
batch         2 settlements in this transaction, in the batch's order:
    1  0xA from 0xB nonce 0x01: settled
       /v1/authorizations/eip155:1/0xA/0xB/0x01
    2  0xA from 0xD nonce 0x02: failed (batch_call_failed)
       /v1/authorizations/eip155:1/0xA/0xD/0x02
`},
		{"unknown state", facilitator.AuthorizationStatus{State: "weird", Basis: "index"}, true,
			`state         weird
authorization   from  nonce 
read from     index, indexed head 0, chain head 0
`},
	} {
		var b bytes.Buffer
		client.PrintStatus(&b, &c.st, c.found)
		if got := b.String(); got != c.want {
			t.Errorf("%s:\n got:\n%s\nwant:\n%s", c.name, got, c.want)
		}
	}
}
