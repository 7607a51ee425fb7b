package main

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/demo"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestDemo runs `facilitator-dev demo` end to end on a fresh database and anvil, and checks from its
// output that the story happened: the first paid attempt lost its response, the retry with the
// same payment succeeded as a replay, the agent read its own receipt without an API key (the
// facilitator serves under --auth keys, as in production), the merchant recorded what it served and
// the agent's lookup shows it, the agent was charged once, and the ledger matched the chain.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	skipOrFail := func(err error) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("the demo needs TEST_DATABASE_URL and anvil: %v", err)
		}
		t.Skipf("needs TEST_DATABASE_URL and anvil; run 'make test' (%v)", err)
	}
	dbURL := stacktest.NewDB(t, "demo")
	out, logs := &stacktest.SyncBuffer{}, &stacktest.SyncBuffer{}
	err := demo.Run(ctx, demo.Options{Start: startDemoStack(facilitatorBin(t), dbURL, logs), LogPath: "(test buffer)"}, out)
	t.Logf("demo output:\n%s", out.String())
	var stackErr *demo.StackError
	if errors.As(err, &stackErr) {
		skipOrFail(err)
	}
	if err != nil {
		t.Fatalf("demo: %v\nlogs:\n%s", err, logs.String())
	}
	text := out.String()

	// The steps come in order.
	last := -1
	for _, step := range []string{
		"1. Start the local stack", "2. Balances before", "3. Agent: GET /weather without paying",
		"4. Agent signs", "5. Agent: GET /weather with PAYMENT-SIGNATURE", "6. Agent retries with the SAME",
		"7. Agent looks the payment up", "8. Balances after", "9. Stop",
	} {
		i := strings.Index(text, step)
		if i < 0 || i < last {
			t.Fatalf("step %q missing or out of order", step)
		}
		last = i
	}
	section := func(from, to string) string {
		i, j := strings.Index(text, from), strings.Index(text, to)
		if i < 0 || j < i {
			t.Fatalf("no section %q..%q", from, to)
		}
		return text[i:j]
	}
	mustHave := func(where, s string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(s, w) {
				t.Errorf("%s: missing %q", where, w)
			}
		}
	}

	mustHave("the unpaid request", section("3. ", "4. "), "← 402", "payment-identifier advertised: true")
	first := section("5. ", "6. ")
	mustHave("the first paid attempt", first, "verify  → valid", "settle  → success", "the response is lost",
		"first paid attempt failed")
	if strings.Contains(first, "REPLAY") || strings.Contains(first, "← 200") {
		t.Errorf("the first paid attempt was a replay or was answered:\n%s", first)
	}
	retry := section("6. ", "7. ")
	mustHave("the retry", retry, "← 200", `"city":"Lisbon"`, "success=true", "replay=true",
		"retry succeeded as a replay", "delivery → recorded sha256")
	if n := strings.Count(retry, "REPLAY"); n != 2 {
		t.Errorf("the retry: want verify and settle both marked as replays, got %d:\n%s", n, retry)
	}

	// One transaction everywhere: the first settle's, the replay's, the status API's, the ledger's.
	txs := map[string]bool{}
	for _, m := range regexp.MustCompile(`0x[0-9a-fA-F]{64}`).FindAllString(section("5. ", "9. "), -1) {
		txs[strings.ToLower(m)] = true
	}
	nonce := regexp.MustCompile(`nonce\s+(0x[0-9a-f]{64})`).FindStringSubmatch(text)
	if nonce == nil {
		t.Fatal("no nonce printed")
	}
	delete(txs, nonce[1])
	if len(txs) != 1 {
		t.Errorf("want one transaction hash throughout the story, got %v", txs)
	}

	lookups := section("7. ", "8. ")
	mustHave("the lookups", lookups, "by nonce", "by payment id", "settled by the facilitator",
		"public view: no payment id", "/r/eip155:", "(the merchant, with its key)",
		"recorded by the merchant = the hash of the")
	if strings.Count(lookups, "pay_") != 1 {
		t.Errorf("the payment id is shown other than once, on the merchant's lookup:\n%s", lookups)
	}
	after := section("8. ", "9. ")
	mustHave("the balances", after, "(-0.01 USDC)", "(+0.01 USDC)", "1 USDC Transfer agent → merchant",
		"the facilitator sent 1 transaction(s)", "charged          once")
	if !strings.HasSuffix(text, "\nledger and chain agree\n") {
		t.Errorf("the demo does not end with the agreement line:\n%s", text)
	}
	if strings.Contains(text, "level=") || strings.Contains(text, "MISMATCH") {
		t.Errorf("log noise or a mismatch in the output:\n%s", text)
	}
	if !strings.Contains(logs.String(), "facilitator listening") {
		t.Errorf("the facilitator's logs did not go to the log writer")
	}
}
