package devchain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
)

const readyTimeout = 20 * time.Second

// anvilProc is a running anvil process.
type anvilProc struct {
	cmd    *exec.Cmd
	port   int
	exited chan struct{} // closed once cmd.Wait returns
	err    error         // cmd.Wait's result, valid after exited
	tail   *tailWriter
}

// startAnvil starts anvil and waits until it answers eth_chainId. A zero port means
// "pick one": the free port found by listening on :0 can be taken by someone else
// before anvil binds it, so that case retries with a new port.
func startAnvil(ctx context.Context, bin, dir string, opts Options, log *slog.Logger) (*anvilProc, *rpc.Client, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, nil, fmt.Errorf("devchain: anvil binary not found at %s; run `npm ci` in the module root: %w", bin, err)
	}
	attempts := 1
	if opts.Port == 0 {
		attempts = 5
	}
	var lastErr error
	for range attempts {
		port := opts.Port
		if port == 0 {
			p, err := freePort()
			if err != nil {
				return nil, nil, err
			}
			port = p
		}
		p, client, err := launchAnvil(ctx, bin, dir, port, opts, log)
		if err == nil {
			return p, client, nil
		}
		lastErr = err
		var early *exitedEarlyError
		if ctx.Err() != nil || !errors.As(err, &early) {
			break
		}
	}
	return nil, nil, lastErr
}

// exitedEarlyError means anvil died during start-up, typically because the port was taken.
type exitedEarlyError struct {
	port   int
	err    error
	output string
}

func (e *exitedEarlyError) Error() string {
	return fmt.Sprintf("devchain: anvil on port %d exited before it was ready (%v): %s", e.port, e.err, e.output)
}

func launchAnvil(ctx context.Context, bin, dir string, port int, opts Options, log *slog.Logger) (*anvilProc, *rpc.Client, error) {
	args := []string{
		"--host", anvilHost(opts.Host),
		"--port", strconv.Itoa(port),
		"--chain-id", strconv.FormatUint(opts.ChainID, 10),
		// Without this anvil may persist old states under ~/.foundry, gigabytes over a long test run.
		"--max-persisted-states", "0",
	}
	if opts.BlockTime > 0 {
		args = append(args, "--block-time", strconv.FormatFloat(opts.BlockTime.Seconds(), 'f', -1, 64))
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	tail := &tailWriter{log: log.With("port", port), max: 30}
	cmd.Stdout = tail
	cmd.Stderr = tail
	setProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("devchain: start %s: %w", bin, err)
	}
	p := &anvilProc{cmd: cmd, port: port, exited: make(chan struct{}), tail: tail}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()

	client, err := p.waitReady(ctx, opts.ChainID)
	if err != nil {
		p.kill()
		return nil, nil, err
	}
	return p, client, nil
}

func (p *anvilProc) url() string { return "http://127.0.0.1:" + strconv.Itoa(p.port) }

func (p *anvilProc) waitReady(ctx context.Context, chainID uint64) (*rpc.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client, err := rpc.DialContext(ctx, p.url())
	if err != nil {
		return nil, fmt.Errorf("devchain: dial anvil: %w", err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var id hexutil.Uint64
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		err := client.CallContext(cctx, &id, "eth_chainId")
		ccancel()
		if err == nil {
			if uint64(id) != chainID {
				client.Close()
				return nil, fmt.Errorf("devchain: anvil on port %d reports chain id %d, want %d (is another node on that port?)", p.port, id, chainID)
			}
			return client, nil
		}
		select {
		case <-p.exited:
			client.Close()
			return nil, &exitedEarlyError{port: p.port, err: p.err, output: p.tail.String()}
		case <-ctx.Done():
			client.Close()
			return nil, fmt.Errorf("devchain: anvil on port %d not ready after %s: %w (last error %v)", p.port, readyTimeout, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// kill stops anvil and everything it spawned, then reaps it.
func (p *anvilProc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	killProcessGroup(p.cmd)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("devchain: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailWriter forwards anvil's output line by line to the logger (debug level)
// and keeps the last lines so start-up failures can say what anvil said.
type tailWriter struct {
	log *slog.Logger
	max int

	mu    sync.Mutex
	buf   []byte
	lines []string
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(w.buf[:i]), "\r")
		w.buf = w.buf[i+1:]
		if strings.TrimSpace(line) == "" {
			continue
		}
		w.log.Debug("anvil", "out", line)
		w.lines = append(w.lines, line)
		if len(w.lines) > w.max {
			w.lines = w.lines[len(w.lines)-w.max:]
		}
	}
	return len(b), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(append(w.lines, string(w.buf)), "\n")
}

func anvilHost(h string) string {
	if h == "" {
		return "127.0.0.1"
	}
	return h
}
