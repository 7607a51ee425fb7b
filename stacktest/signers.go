package stacktest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/extsigner"
	"github.com/x402-facilitator/x402-facilitator/settle"
)

// ClefVersion is the go-ethereum release whose Clef the tests run: Clef left go-ethereum's tree
// after it (the module in go.mod has none), and its external API (account_signTransaction,
// version 6.1.0) is the one remote signers speak.
const ClefVersion = "v1.16.9"

// clefRules approves every transaction and listing: the tests exercise our side of the API, and
// a policy of our own is the narrow signer's (extsigner).
const clefRules = `function ApproveTx(r) { return "Approve" }
function ApproveListing(r) { return "Approve" }
function OnSignerStartup(i) {}
function OnApprovedTx(r) {}
`

// Clef is a running go-ethereum Clef holding test keys, on a loopback HTTP port, approving by a
// rules file with the keys' passwords in its credential store (so it never prompts).
type Clef struct {
	URL  string
	Keys []common.Address

	t    testing.TB
	dir  string
	bin  string
	args []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *bytes.Buffer
}

var (
	clefOnce sync.Once
	clefBin  string
	clefErr  error
)

// clefBinary builds Clef once per machine (into the user's cache directory, from the Go module
// proxy or cache) and returns its path.
func clefBinary() (string, error) {
	clefOnce.Do(func() {
		dir, err := os.UserCacheDir()
		if err != nil {
			dir = os.TempDir()
		}
		gobin := filepath.Join(dir, "x402-facilitator", "clef-"+ClefVersion)
		clefBin = filepath.Join(gobin, "clef")
		if _, err := os.Stat(clefBin); err == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "install", "github.com/ethereum/go-ethereum/cmd/clef@"+ClefVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			clefErr = fmt.Errorf("building clef %s: %v\n%s", ClefVersion, err, out)
		}
	})
	return clefBin, clefErr
}

const clefPassword = "a test password, not a secret"

// StartClef runs Clef for chainID with keys in its keystore, stopped when the test ends. Without
// Go's module proxy or cache (no Clef) it fails the test under CI=true and skips it elsewhere.
func StartClef(t testing.TB, chainID uint64, keys ...*ecdsa.PrivateKey) *Clef {
	t.Helper()
	bin, err := clefBinary()
	if err != nil {
		missing(t, "this test needs go-ethereum's clef: %v", err)
	}
	dir := t.TempDir()
	c := &Clef{t: t, dir: dir, bin: bin, out: &bytes.Buffer{}}
	base := []string{"--configdir", filepath.Join(dir, "config"), "--keystore", filepath.Join(dir, "keystore"), "--suppress-bootwarn", "--lightkdf", "--nousb"}
	pw := clefPassword + "\n"
	c.run(t, pw+pw, append(base, "init")...)
	for i, k := range keys {
		f := filepath.Join(dir, fmt.Sprintf("key%d", i))
		if err := os.WriteFile(f, []byte(hex.EncodeToString(crypto.FromECDSA(k))), 0o600); err != nil {
			t.Fatal(err)
		}
		c.run(t, pw+pw, append(base, "importraw", f)...)
		_ = os.Remove(f)
		addr := crypto.PubkeyToAddress(k.PublicKey)
		// The key's password for the rules engine, then the master seed's.
		c.run(t, pw+pw+pw, append(base, "setpw", addr.Hex())...)
		c.Keys = append(c.Keys, addr)
	}
	rules := filepath.Join(dir, "rules.js")
	if err := os.WriteFile(rules, []byte(clefRules), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(clefRules))
	c.run(t, pw, append(base, "attest", hex.EncodeToString(sum[:]))...)
	c.args = append(base, "--chainid", fmt.Sprint(chainID), "--rules", rules, "--http", "--http.addr", "127.0.0.1",
		"--ipcdisable", "--auditlog", filepath.Join(dir, "audit.log"), "--4bytedb-custom", filepath.Join(dir, "4byte.json"), "--http.port", "0")
	c.Start()
	t.Cleanup(c.Stop)
	return c
}

// run runs one of Clef's set-up commands with input on its stdin.
func (c *Clef) run(t testing.TB, input string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Dir = c.dir
	cmd.Stdin = strings.NewReader(input)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clef %s: %v\n%s", args[len(args)-1], err, out)
	}
}

var clefListening = regexp.MustCompile(`HTTP endpoint opened\s+url=(http://[0-9.:]+/)`)

// Start starts Clef (again after Stop, on the same port).
func (c *Clef) Start() {
	t := c.t
	t.Helper()
	c.mu.Lock()
	running := c.cmd != nil
	c.mu.Unlock()
	if running {
		return
	}
	cmd := exec.Command(c.bin, c.args...)
	cmd.Dir = c.dir
	// The master seed's password, answered at the prompt; stdin then stays open (a closed one
	// would end Clef's console).
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting clef: %v", err)
	}
	exited := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.exited, c.out = cmd, exited, &bytes.Buffer{}
	c.mu.Unlock()
	go func() { _ = cmd.Wait(); _ = pw.Close(); close(exited) }()
	if _, err := io.WriteString(stdin, clefPassword+"\n"); err != nil {
		c.Stop()
		t.Fatalf("clef's password prompt: %v", err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.out.WriteString(line + "\n")
			c.mu.Unlock()
			if m := clefListening.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case u := <-found:
		c.URL = u
		// A restart listens where the first start did, so clients made for it reach it again.
		if i := strings.LastIndex(u, ":"); i > 0 {
			c.args[len(c.args)-1] = strings.TrimSuffix(u[i+1:], "/")
		}
		if log := c.Log(); !strings.Contains(log, "Rule engine configured") {
			c.Stop()
			t.Fatalf("clef started without its rules:\n%s", log)
		}
	case <-exited:
		t.Fatalf("clef exited at start:\n%s", c.Log())
	case <-time.After(30 * time.Second):
		c.Stop()
		t.Fatalf("clef did not open its HTTP endpoint within 30 s:\n%s", c.Log())
	}
}

// Stop stops Clef (the signer is then down: connections are refused) and waits for it to exit.
func (c *Clef) Stop() {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Signers are Clef's keys as the settlement engine signs with them, over its HTTP API.
func (c *Clef) Signers(t testing.TB, chainID uint64) []settle.Signer {
	t.Helper()
	ep, err := extsigner.Dial(context.Background(), c.URL, chainID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Close)
	out := make([]settle.Signer, len(c.Keys))
	for i, a := range c.Keys {
		out[i] = ep.Signer(a)
	}
	return out
}

// Log is what Clef printed so far.
func (c *Clef) Log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// NarrowSigner is our own narrow signer (extsigner.Server, what `facilitator signer` serves) for
// keys on an HTTP test server, signing only settlements of the env's USDC within the ceilings of
// policy (its ChainID, Token and the token's domain are the env's when zero); stopped when the test ends.
func (e *Env) NarrowSigner(t testing.TB, policy extsigner.Policy, keys ...*ecdsa.PrivateKey) []settle.Signer {
	t.Helper()
	if policy.ChainID == 0 {
		policy.ChainID = e.Chain.ChainID
	}
	if policy.Token == (common.Address{}) {
		policy.Token = e.Chain.USDC.Address
	}
	if policy.TokenName == "" && policy.TokenVersion == "" {
		policy.TokenName, policy.TokenVersion = e.Chain.USDC.Name, e.Chain.USDC.Version
	}
	srv, err := extsigner.NewServer(policy, keys, Logger(t).With("component", "narrow-signer"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := srv.Handler()
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	ep, err := extsigner.Dial(context.Background(), hs.URL, policy.ChainID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Close)
	out := make([]settle.Signer, len(keys))
	for i, k := range keys {
		out[i] = ep.Signer(crypto.PubkeyToAddress(k.PublicKey))
	}
	return out
}
