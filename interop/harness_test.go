package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/official"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// diffChainID is Base Sepolia's: the official v1 scheme only knows chains in its name table, so
// running anvil under this id lets v1 payloads be compared too.
const diffChainID = 84532

var (
	env         *stacktest.Env
	chain       *devchain.Chain
	officialURL string
)

func TestMain(m *testing.M) {
	stacktest.MainWith(m, stacktest.Options{Chain: devchain.Options{ChainID: diffChainID}, V1Name: "base-sepolia"},
		func(e *stacktest.Env) (int, error) { return run(m, e) })
}

func run(m *testing.M, e *stacktest.Env) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, chain = e, e.Chain

	// The official facilitator signs with dev account #0.
	ref, err := official.Start(ctx, official.Config{Script: "js/official-facilitator.mjs",
		Key: chain.Accounts[0].Key, Stderr: os.Stderr}, chain.RPCURL, diffChainID)
	if err != nil {
		return 0, err
	}
	defer ref.Stop()
	officialURL = ref.URL
	return m.Run(), nil
}

// process is a child node script that serves HTTP.
type process struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// signCase is one input to js/sign.mjs.
type signCase struct {
	Name                   string            `json:"name"`
	Version                int               `json:"version"`
	Key                    string            `json:"key"`
	Requirements           map[string]any    `json:"requirements"`
	Now                    int64             `json:"now,omitempty"`
	AuthorizationOverrides map[string]string `json:"authorizationOverrides,omitempty"`
	DomainOverrides        map[string]any    `json:"domainOverrides,omitempty"`
}

// signAll has the official client sign every case in one node run.
func signAll(t *testing.T, cases []signCase) []map[string]any {
	t.Helper()
	in, err := json.Marshal(map[string]any{"cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "js/sign.mjs")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("sign.mjs: %v: %s", err, stderr.String())
	}
	var res struct {
		Payloads []struct {
			Name           string         `json:"name"`
			PaymentPayload map[string]any `json:"paymentPayload"`
		} `json:"payloads"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("sign.mjs output: %v", err)
	}
	if len(res.Payloads) != len(cases) {
		t.Fatalf("sign.mjs signed %d of %d cases", len(res.Payloads), len(cases))
	}
	payloads := make([]map[string]any, len(cases))
	for i, p := range res.Payloads {
		if p.Name != cases[i].Name {
			t.Fatalf("sign.mjs answered %q for case %q", p.Name, cases[i].Name)
		}
		payloads[i] = p.PaymentPayload
	}
	return payloads
}

// verdict is what a facilitator answered to one /verify.
type verdict struct {
	Status  int
	IsValid bool
	Reason  string
}

func (v verdict) String() string {
	if v.Status != http.StatusOK {
		return fmt.Sprintf("HTTP %d %s", v.Status, v.Reason)
	}
	if v.IsValid {
		return "valid"
	}
	return v.Reason
}

func postVerify(t *testing.T, base string, body []byte) verdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/verify", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s/verify: %v", base, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var v struct {
		IsValid       bool   `json:"isValid"`
		InvalidReason string `json:"invalidReason"`
	}
	_ = json.Unmarshal(raw, &v)
	return verdict{Status: res.StatusCode, IsValid: v.IsValid, Reason: v.InvalidReason}
}
