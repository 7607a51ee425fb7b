package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/api"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/devchain/devchaintest"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

// diffChainID is Base Sepolia's: the official v1 scheme only knows chains in its name table, so
// running anvil under this id lets v1 payloads be compared too.
const diffChainID = 84532

var (
	chain       *devchain.Chain
	oursURL     string
	officialURL string
)

func TestMain(m *testing.M) {
	devchaintest.Main(m, devchain.Options{ChainID: diffChainID}, func(c *devchain.Chain) (int, error) { return run(m, c) })
}

func run(m *testing.M, c *devchain.Chain) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	chain = c

	official, err := startOfficial(ctx, c)
	if err != nil {
		return 0, err
	}
	defer official.stop()
	officialURL = official.url

	n := facilitator.Network{ID: facilitator.CAIP2(diffChainID), ChainID: diffChainID, V1Name: "base-sepolia",
		Tokens: []facilitator.Token{{Address: c.USDC.Address, Name: c.USDC.Name, Version: c.USDC.Version}}}
	v, err := verify.New(verify.Config{Networks: []facilitator.Network{n},
		Readers: map[string]verify.Reader{n.ID: &verify.RPCReader{Client: c.RPC, Timeout: 5 * time.Second}}})
	if err != nil {
		return 0, err
	}
	srv := httptest.NewServer(api.New(api.Config{Verifier: v,
		Supported: facilitator.Supported([]facilitator.Network{n}, nil, nil)}).Handler())
	defer srv.Close()
	oursURL = srv.URL
	return m.Run(), nil
}

type process struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

// startOfficial runs the official facilitator with dev account #0 as its signer and waits for
// the one line it prints once listening.
func startOfficial(ctx context.Context, c *devchain.Chain) (*process, error) {
	cmd := exec.Command("node", "js/official-facilitator.mjs", "--rpc", c.RPCURL, "--chain-id", fmt.Sprint(diffChainID), "--port", "0")
	cmd.Env = append(os.Environ(), "FACILITATOR_KEY=0x"+hex.EncodeToString(crypto.FromECDSA(c.Accounts[0].Key)))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the official facilitator: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	select {
	case line := <-lines:
		url, ok := strings.CutPrefix(line, "listening ")
		if !ok {
			p.stop()
			return nil, fmt.Errorf("official facilitator said %q", line)
		}
		p.url = url
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("official facilitator exited before listening")
	case <-ctx.Done():
		p.stop()
		return nil, fmt.Errorf("official facilitator did not start: %w", ctx.Err())
	}
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
