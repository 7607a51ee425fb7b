package facilitator_test

import (
	"errors"
	"testing"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

func TestDeliveryTarget(t *testing.T) {
	key := func(b byte) facilitator.AuthorizationKey {
		return facilitator.AuthorizationKey{Network: "eip155:8453", Asset: common.HexToAddress("0xa"), Payer: common.HexToAddress("0xb"), Nonce: [32]byte{b}}
	}
	member := func(id int64, b byte, state facilitator.State, keyID string) facilitator.DeliveryCandidate {
		return facilitator.DeliveryCandidate{ID: id, Key: key(b), State: state, KeyID: keyID}
	}
	lone := []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateMined, "shopa")}
	batch := []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateFinal, "shopa"), member(2, 2, facilitator.StateMined, "shopa"), member(3, 3, facilitator.StateMined, "shopb")}
	k2, k3, k9 := key(2), key(3), key(9)
	for _, c := range []struct {
		name    string
		members []facilitator.DeliveryCandidate
		a       facilitator.DeliveryAttachment
		want    int64  // the settlement picked, when allowed
		reason  string // the refusal's reason, when refused
		code    facilitator.Code
	}{
		{"a lone settlement by its key", lone, facilitator.DeliveryAttachment{KeyID: "shopa"}, 1, "", ""},
		{"a lone settlement named by its authorization", lone, facilitator.DeliveryAttachment{KeyID: "shopa", Authorization: &facilitator.AuthorizationKey{Network: "eip155:8453", Asset: common.HexToAddress("0xa"), Payer: common.HexToAddress("0xb"), Nonce: [32]byte{1}}}, 1, "", ""},
		{"open mode: anyone", lone, facilitator.DeliveryAttachment{}, 1, "", ""},
		{"another key", lone, facilitator.DeliveryAttachment{KeyID: "shopb"}, 0, facilitator.ReasonNotSettlingKey, facilitator.EForbidden},
		{"no settlement", nil, facilitator.DeliveryAttachment{KeyID: "shopa"}, 0, facilitator.ReasonNotFound, facilitator.ENotFound},
		{"a batch without an authorization", batch, facilitator.DeliveryAttachment{KeyID: "shopa"}, 0, facilitator.ReasonInvalidDelivery, facilitator.EInvalid},
		{"a batch's member by its authorization", batch, facilitator.DeliveryAttachment{KeyID: "shopa", Authorization: &k2}, 2, "", ""},
		{"a batch's member of another merchant", batch, facilitator.DeliveryAttachment{KeyID: "shopa", Authorization: &k3}, 0, facilitator.ReasonNotSettlingKey, facilitator.EForbidden},
		{"an authorization not in the batch", batch, facilitator.DeliveryAttachment{KeyID: "shopa", Authorization: &k9}, 0, facilitator.ReasonNotFound, facilitator.ENotFound},
		{"signed, not mined", []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateSigned, "shopa")}, facilitator.DeliveryAttachment{KeyID: "shopa"}, 0, facilitator.ReasonSettlementPending, facilitator.EConflict},
		{"broadcast, not mined", []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateBroadcast, "shopa")}, facilitator.DeliveryAttachment{KeyID: "shopa"}, 0, facilitator.ReasonSettlementPending, facilitator.EConflict},
		{"reverted", []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateReverted, "shopa")}, facilitator.DeliveryAttachment{KeyID: "shopa"}, 0, facilitator.ReasonSettlementNotSucceeded, facilitator.EConflict},
		{"settled elsewhere", []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateSettledElsewhere, "shopa")}, facilitator.DeliveryAttachment{KeyID: "shopa"}, 0, facilitator.ReasonSettlementNotSucceeded, facilitator.EConflict},
		{"another key asking of a pending settlement learns only that it is not its", []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateSigned, "shopa")}, facilitator.DeliveryAttachment{KeyID: "shopb"}, 0, facilitator.ReasonNotSettlingKey, facilitator.EForbidden},
		{"settled in open mode, attached with a key", []facilitator.DeliveryCandidate{member(1, 1, facilitator.StateMined, "")}, facilitator.DeliveryAttachment{KeyID: "shopa"}, 0, facilitator.ReasonNotSettlingKey, facilitator.EForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := facilitator.DeliveryTarget(c.members, c.a)
			if c.reason == "" {
				if err != nil || got.ID != c.want {
					t.Fatalf("got %d, %v; want settlement %d", got.ID, err, c.want)
				}
				return
			}
			if r := facilitator.ErrorReason(err, "?"); r != c.reason || facilitator.ErrorCode(err) != c.code {
				t.Fatalf("got %d, %v (%s, %s); want %s (%s)", got.ID, err, r, facilitator.ErrorCode(err), c.reason, c.code)
			}
			if c.code == facilitator.ENotFound && !errors.Is(err, facilitator.ErrNotFound) {
				t.Fatalf("%v is not ErrNotFound", err)
			}
		})
	}
}

func TestDeliveryRecordSame(t *testing.T) {
	size := func(n int64) *int64 { return &n }
	a := facilitator.DeliveryRecord{SHA256: "0xab", ContentType: "application/json", Size: size(3)}
	for _, c := range []struct {
		name string
		b    facilitator.DeliveryRecord
		same bool
	}{
		{"identical", a, true},
		{"the digest in capitals", facilitator.DeliveryRecord{SHA256: "0xAB", ContentType: "application/json", Size: size(3)}, true},
		{"another digest", facilitator.DeliveryRecord{SHA256: "0xac", ContentType: "application/json", Size: size(3)}, false},
		{"another content type", facilitator.DeliveryRecord{SHA256: "0xab", ContentType: "text/plain", Size: size(3)}, false},
		{"no size", facilitator.DeliveryRecord{SHA256: "0xab", ContentType: "application/json"}, false},
		{"another size", facilitator.DeliveryRecord{SHA256: "0xab", ContentType: "application/json", Size: size(4)}, false},
	} {
		if got := a.Same(c.b); got != c.same {
			t.Errorf("%s: Same = %v, want %v", c.name, got, c.same)
		}
	}
}
