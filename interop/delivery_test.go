package interop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/jackc/pgx/v5"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/auth"
	"github.com/x402-facilitator/x402-facilitator/client"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/facilitator/postgres"
)

// TestExpressMerchantRecordsDelivery: a merchant on @x402/express (js/merchant-delivery.mjs),
// under our facilitator in keys mode, records from the resource server's onAfterSettle hook the
// SHA-256 of the response it served; a client on @x402/fetch pays, and the authorization's
// status then carries a delivery record whose digest is the SHA-256 of the very bytes the client
// received, recorded by the merchant's key (another key is refused).
func TestExpressMerchantRecordsDelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := startStack(t, ctx, stackOptions{db: "interop_delivery", config: func(cfg *api.Config, db *postgres.DB) {
		cfg.Status, cfg.Deliveries = env.Status(db, 1), db
		cfg.Auth = &api.AuthConfig{Mode: api.AuthKeys, Keys: db}
	}})
	merchantKey := newAPIKey(t, ctx, s.db, facilitator.ScopeVerify, facilitator.ScopeSettle, facilitator.ScopeStatus)
	otherKey := newAPIKey(t, ctx, s.db, facilitator.ScopeSettle, facilitator.ScopeStatus)

	payerKey, payer := newPayer(t, ctx, 1_000_000)
	payTo := lostRandomAddress(t)
	m := startNode(t, "js/merchant-delivery.mjs", []string{"--facilitator", s.url, "--chain-id", fmt.Sprint(diffChainID),
		"--asset", chain.USDC.Address.Hex(), "--pay-to", payTo.Hex(), "--amount", fmt.Sprint(merchantPrice),
		"--token-name", chain.USDC.Name, "--token-version", chain.USDC.Version, "--port", "0"},
		"FACILITATOR_API_KEY="+merchantKey)
	url := m.listening(t, ctx)

	res := payV2(t, ctx, url+"/paid", keyHex(payerKey.D.Bytes()))
	txHash := checkV2Paid(t, res, payer)
	if !strings.HasPrefix(res.BodySHA256, "0x") || len(res.BodySHA256) != 66 {
		t.Fatalf("the client's digest of the body: %q", res.BodySHA256)
	}
	a, _ := res.PaymentPayload["payload"].(map[string]any)
	authz, _ := a["authorization"].(map[string]any)
	nonce, _ := authz["nonce"].(string)
	n, err := hexutil.Decode(nonce)
	if err != nil || len(n) != 32 {
		t.Fatalf("the payload's nonce %q: %v", nonce, err)
	}
	key := facilitator.AuthorizationKey{Network: facilitator.CAIP2(diffChainID), Asset: chain.USDC.Address, Payer: payer, Nonce: [32]byte(n)}

	// The hook does not wait for the record, so the record may land just after the client's
	// answer: read the status until it is there.
	reader := client.New(s.url, client.WithHeader("Authorization", "Bearer "+otherKey))
	var st *facilitator.AuthorizationStatus
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _, err = reader.Authorization(ctx, key)
		if err != nil {
			t.Fatalf("the authorization's status: %v", err)
		}
		if st.Delivery != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("merchant:\n%s", m.stderr.String())
	if st.Delivery == nil {
		t.Fatalf("no delivery record on the status after 20 s: %+v", st)
	}
	if st.State != facilitator.StatusSettled || !strings.EqualFold(st.Transaction, txHash) {
		t.Errorf("the status: %s %s, want settled by %s", st.State, st.Transaction, txHash)
	}
	if st.Delivery.SHA256 != strings.ToLower(res.BodySHA256) {
		t.Errorf("the record's digest %s, the SHA-256 of what the client received %s", st.Delivery.SHA256, res.BodySHA256)
	}
	if !strings.HasPrefix(st.Delivery.ContentType, "application/json") || st.Delivery.Size == nil || *st.Delivery.Size <= 0 {
		t.Errorf("the record: %+v", st.Delivery)
	}
	conn, err := pgx.Connect(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var holder string
	if err := conn.QueryRow(ctx, `SELECT d.key_id FROM delivery_records d JOIN settlements s ON s.id = d.settlement_id WHERE s.tx_hash = $1`,
		common.HexToHash(txHash).Bytes()).Scan(&holder); err != nil || !strings.HasPrefix(merchantKey, "x402_"+holder+"_") {
		t.Errorf("the record was set by key %q (%v), want the merchant's", holder, err)
	}

	// Another merchant's key cannot set it, nor replace it.
	_, err = reader.AttachDelivery(ctx, common.HexToHash(txHash), &key, []byte("another answer"), "text/plain")
	var refused *client.Error
	if !errors.As(err, &refused) || refused.Reason != facilitator.ReasonNotSettlingKey {
		t.Errorf("another key's record: %v, want not_settling_key", err)
	}
}

// newAPIKey stores a new API key with scopes and returns its text.
func newAPIKey(t *testing.T, ctx context.Context, db *postgres.DB, scopes ...facilitator.Scope) string {
	t.Helper()
	full, id, hash, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := db.InsertAPIKey(ctx, &facilitator.APIKey{ID: id, Hash: hash, Name: t.Name(), Scopes: scopes}); err != nil {
		t.Fatal(err)
	}
	return full
}

// TestReadmeDeliverySnippet: the README's @x402/express snippet is the hook the tested merchant
// (js/merchant-delivery.mjs) runs, line for line, so the README shows what the test runs.
func TestReadmeDeliverySnippet(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("js/merchant-delivery.mjs")
	if err != nil {
		t.Fatal(err)
	}
	between := func(text, from, to string) []string {
		t.Helper()
		i := strings.Index(text, from)
		j := strings.Index(text[max(i, 0):], to)
		if i < 0 || j < 0 {
			t.Fatalf("no %q … %q", from, to)
		}
		var out []string
		for _, l := range strings.Split(text[i:i+j], "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	shown := between(string(readme), "const auth = { Authorization", "// app.use(paymentMiddleware(routes, server)) as usual")
	run := between(string(script), "const auth = { Authorization", "// --- the README's snippet ends here ---")
	if !slices.Equal(shown, run) {
		t.Errorf("the README's snippet:\n%s\n\nis not what js/merchant-delivery.mjs runs:\n%s", strings.Join(shown, "\n"), strings.Join(run, "\n"))
	}
}
