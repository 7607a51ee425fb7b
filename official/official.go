// Package official runs the official x402 facilitator (the TypeScript one of the @x402 packages,
// interop/js/official-facilitator.mjs) as a child process: the reference that 'facilitator-dev bench'
// measures ours beside and that the interop tests compare ours against.
package official

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
)

// Config says how to run the official TypeScript facilitator (interop/js/official-facilitator.mjs)
// as the reference.
type Config struct {
	Node   string // node binary ("" is "node" on PATH)
	Script string // path of official-facilitator.mjs
	// Poll is viem's receipt polling interval. viem's default (4 s) would make the reference's
	// settle latency a polling artefact, so the run sets the same interval our dev stack uses.
	Poll time.Duration
	Key  *ecdsa.PrivateKey // its signer; an account nobody else sends from
	// Stderr receives the process's diagnostics (nil discards them).
	Stderr io.Writer
}

// Process is a running official facilitator.
type Process struct {
	cmd  *exec.Cmd
	URL  string
	done chan struct{}
}

// Start runs the official facilitator against rpcURL and waits (bounded by ctx) for the one line
// it prints once listening.
func Start(ctx context.Context, o Config, rpcURL string, chainID uint64) (*Process, error) {
	bin := o.Node
	if bin == "" {
		bin = "node"
	}
	args := []string{o.Script, "--rpc", rpcURL, "--chain-id", strconv.FormatUint(chainID, 10), "--port", "0"}
	if o.Poll > 0 {
		args = append(args, "--polling-interval-ms", strconv.FormatInt(o.Poll.Milliseconds(), 10))
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "FACILITATOR_KEY=0x"+hex.EncodeToString(crypto.FromECDSA(o.Key)))
	cmd.Stderr = o.Stderr
	// If we die without stopping it, the kernel does: no orphan keeps sending from its key.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the official facilitator: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
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
			p.Stop()
			return nil, fmt.Errorf("official facilitator said %q", line)
		}
		p.URL = url
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("official facilitator (%s %s) exited before listening; is node_modules installed (scripts/npm.sh)?", bin, o.Script)
	case <-ctx.Done():
		p.Stop()
		return nil, fmt.Errorf("official facilitator did not start: %w", ctx.Err())
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop asks it to exit (it gives in-flight settles 2 s) and kills it if it does not.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
