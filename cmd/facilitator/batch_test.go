package main

import (
	"strings"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestBatchConfig: a network's "batch" entry becomes its batch policy; absent is off, and
// nonsense is refused with the network and the field named.
func TestBatchConfig(t *testing.T) {
	env := func(batch string) map[string]string {
		n := `{"id":"eip155:8453","rpc":"http://127.0.0.1:1","tokens":[{"address":"0x0000000000000000000000000000000000000001","name":"USD Coin","version":"2"}]`
		if batch != "" {
			n += `,"batch":` + batch
		}
		return map[string]string{"DATABASE_URL": "postgres://x", "FACILITATOR_NETWORKS": "[" + n + "}]"}
	}
	domain := func(batch string) ([]facilitator.Network, error) {
		e := env(batch)
		cfg, err := parseServeFlags(nil, func(k string) string { return e[k] })
		if err != nil {
			return nil, err
		}
		return cfg.Domain()
	}
	ns, err := domain("")
	if err != nil || ns[0].Batch.On() {
		t.Fatalf("no batch entry: %+v, %v", ns, err)
	}
	ns, err = domain(`{"max":20,"wait":"150ms"}`)
	if err != nil || ns[0].Batch != (facilitator.BatchPolicy{Max: 20, Wait: 150 * time.Millisecond}) {
		t.Fatalf("batch: %+v, %v", ns, err)
	}
	for batch, says := range map[string]string{
		`{"max":101,"wait":"1s"}`: "batch max 101",
		`{"max":1}`:               "at least 2",
		`{"max":5,"wait":"3s"}`:   "batch wait 3s",
		`{"max":5,"wait":"soon"}`: `wait "soon"`,
	} {
		_, err := domain(batch)
		if err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "eip155:8453") {
			t.Errorf("%s: %v, want an error naming the network and %q", batch, err, says)
		}
	}
}

// TestDevBatch: `facilitator dev --batch-max N --batch-wait D` gives the dev network that batch
// entry; 0 is off, and a policy serve would refuse is refused before anvil starts.
func TestDevBatch(t *testing.T) {
	if bc, err := devBatch(0, time.Second); bc != nil || err != nil {
		t.Fatalf("--batch-max 0: %+v, %v; want off", bc, err)
	}
	bc, err := devBatch(30, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := bc.policy(); err != nil || p != (facilitator.BatchPolicy{Max: 30, Wait: 100 * time.Millisecond}) {
		t.Fatalf("--batch-max 30 --batch-wait 100ms: %+v, %v", p, err)
	}
	for _, c := range []struct {
		max  int
		wait time.Duration
	}{{1, time.Second}, {101, time.Second}, {20, 3 * time.Second}, {-1, time.Second}} {
		if _, err := devBatch(c.max, c.wait); err == nil || !strings.Contains(err.Error(), "--batch-max") {
			t.Errorf("--batch-max %d --batch-wait %s: %v, want refused", c.max, c.wait, err)
		}
	}
}
