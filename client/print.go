package client

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// PrintStatus writes a status answer for a person: one labelled line per known field, with what
// a merchant or agent should do in that state. found is false when neither the facilitator's
// ledger nor its index has seen the authorization, so the state is the chain's own word.
func PrintStatus(w io.Writer, st *facilitator.AuthorizationStatus, found bool) {
	state := st.State
	if st.SettledBy != "" {
		state += " (by " + st.SettledBy + ")"
	}
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-13s %s\n", k, v)
		}
	}
	row("state", state)
	row("meaning", facilitator.StatusAdvice(st.State))
	if !found {
		row("note", "never seen by this facilitator's ledger or index: this is the chain's own answer")
	}
	row("authorization", fmt.Sprintf("%s %s from %s nonce %s", st.Network, st.Asset, st.Authorizer, st.Nonce))
	row("payment id", st.PaymentID)
	if len(st.PaymentIDs) > 0 {
		row("payment ids", strings.Join(st.PaymentIDs, ", "))
	}
	row("transaction", st.Transaction)
	if st.BlockNumber > 0 {
		final := "not final yet"
		if st.Final {
			final = "final"
		}
		row("block", fmt.Sprintf("%d (%d confirmations, %s)", st.BlockNumber, st.Confirmations, final))
	}
	if st.Finality.Rule != "" {
		at := "no block known final"
		if st.Finality.FinalBlock > 0 {
			at = fmt.Sprintf("final up to block %d", st.Finality.FinalBlock)
		}
		row("finality", st.Finality.Rule+", "+at)
	}
	if st.To != "" {
		row("paid", fmt.Sprintf("%s to %s", st.Value, st.To))
	}
	row("reason", st.Reason)
	if d := st.Delivery; d != nil {
		// The merchant's word on what it served: a payer compares it with the SHA-256 of what it got.
		what := "sha256 " + d.SHA256
		if d.ContentType != "" {
			what += ", " + d.ContentType
		}
		if d.Size != nil {
			what += fmt.Sprintf(", %d bytes", *d.Size)
		}
		row("delivered", what+", recorded "+d.RecordedAt.UTC().Format(time.RFC3339)+" by the merchant")
	}
	if st.View == facilitator.ViewPublic {
		// Asked without an API key: no payment ids, and our ledger only once our transaction was sent.
		row("view", "public (no API key)")
		row("read from", fmt.Sprintf("%s, chain head %d", st.Basis, st.Head))
	} else {
		row("read from", fmt.Sprintf("%s, indexed head %d, chain head %d", st.Basis, st.IndexedHead, st.Head))
	}
	if len(st.Batch) > 0 {
		// The answer's own fields are the batch's first settlement's: the others are only named
		// here, each with the path of its own full answer.
		fmt.Fprintf(w, "batch         %d settlements in this transaction, in the batch's order:\n", len(st.Batch))
		for i, b := range st.Batch {
			state := b.State
			if b.Reason != "" {
				state += " (" + b.Reason + ")"
			}
			fmt.Fprintf(w, "  %3d  %s from %s nonce %s: %s\n       %s\n", i+1, b.Asset, b.Authorizer, b.Nonce, state, b.Status)
		}
	}
}
