package main

import (
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"strconv"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// runDev runs the local stack: a fresh anvil with Circle's USDC, and the production binary's serve
// pointed at it. The facilitator signs with dev account #0, the one anvil prints first; accounts
// #1-#9 are payers.
func runDev(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:4021", "address the facilitator listens on")
	chainID := fs.Uint64("chain-id", devchain.DefaultChainID, "anvil's chain id")
	port := fs.Int("anvil-port", 8545, "anvil's port (0 picks a free one)")
	host := fs.String("anvil-host", "127.0.0.1", "address anvil binds (0.0.0.0 in a container that publishes its port)")
	blockTime := fs.Duration("block-time", 0, "anvil block interval (0 mines one block per transaction)")
	dbURL := fs.String("database-url", getenv("DATABASE_URL"), "Postgres connection string (DATABASE_URL)")
	logLevel := fs.String("log-level", "info", "log level")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on this loopback address, e.g. 127.0.0.1:6060 (empty: off)")
	nSigners := fs.Int("signers", 1, "facilitator signer keys: dev account #0, then deterministic extra keys funded with ETH")
	batchMax := fs.Int("batch-max", 0, "batch up to this many settlements per Multicall3 transaction (0: off; the network's \"batch\" entry)")
	batchWait := fs.Duration("batch-wait", 150*time.Millisecond, "with --batch-max: the longest a batch's first settlement waits for others")
	binary := fs.String("facilitator", "", "the production binary to serve with (default: 'facilitator' beside this one, else on PATH)")
	checkPorts := fs.Bool("check-ports", false, "check that anvil's port and the listen address are free, and exit ('make run' asks before it recreates the database)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nSigners < 1 {
		return fmt.Errorf("--signers must be at least 1, got %d", *nSigners)
	}
	// Before anything starts: a taken port is refused at once, by name.
	if *port != 0 {
		if err := checkPortFree("anvil", net.JoinHostPort(*host, strconv.Itoa(*port)), "--anvil-port"); err != nil {
			return err
		}
	}
	if err := checkPortFree("the facilitator", *listen, "--listen"); err != nil {
		return err
	}
	if *checkPorts {
		return nil
	}
	if *dbURL == "" {
		return errors.New("dev: DATABASE_URL is required ('make run' makes one)")
	}
	batch, err := devBatch(*batchMax, *batchWait)
	if err != nil {
		return err
	}
	bin, err := facilitatorBinary(*binary)
	if err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel)

	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	chain, err := devchain.Start(startCtx, devchain.Options{ChainID: *chainID, Port: *port, Host: *host, BlockTime: *blockTime, Logger: log})
	if err != nil {
		return err
	}
	defer chain.Close()
	signers, err := devSigners(startCtx, chain, *nSigners)
	if err != nil {
		return err
	}
	srv, err := startServe(startCtx, stackConfig{Binary: bin, Listen: *listen, DBURL: *dbURL, LogLevel: *logLevel,
		Pprof: *pprofAddr, Chain: chain, Signers: signers, Batch: batch}, stderr)
	if err != nil {
		return err
	}
	printStack(stdout, srv.Addr, chain, len(signers))
	<-ctx.Done()
	fmt.Fprintln(stdout, "\nstopping the facilitator and anvil")
	return srv.Close()
}

// devBatch is the dev network's batch policy from --batch-max and --batch-wait (off when max is
// 0), checked as serve checks a configured entry, before anvil starts.
func devBatch(max int, wait time.Duration) (facilitator.BatchPolicy, error) {
	if max == 0 {
		return facilitator.BatchPolicy{}, nil
	}
	p := facilitator.BatchPolicy{Max: max, Wait: wait}
	if max < 2 {
		return p, fmt.Errorf("--batch-max/--batch-wait: max %d: a batch holds at least 2 settlements (0 for none)", max)
	}
	if err := p.Check(); err != nil {
		return p, fmt.Errorf("--batch-max/--batch-wait: %w", err)
	}
	return p, nil
}

// devSigners is dev account #0 and n-1 extra keys. One key sends one transaction at a time in
// nonce order, so a single key caps the settle rate; extra keys (not among #1-#9, which payers and
// the load generator use) lift that cap without colliding with anyone's nonces.
func devSigners(ctx context.Context, chain *devchain.Chain, n int) ([]*ecdsa.PrivateKey, error) {
	keys := []*ecdsa.PrivateKey{chain.Accounts[0].Key}
	thousandETH := new(big.Int).Mul(big.NewInt(1000), big.NewInt(1e18))
	for i := 1; i < n; i++ {
		a, err := devchain.ExtraSigner(i)
		if err != nil {
			return nil, err
		}
		if err := chain.SetBalance(ctx, a.Address, thousandETH); err != nil {
			return nil, err
		}
		keys = append(keys, a.Key)
	}
	return keys, nil
}

func printStack(w io.Writer, addr string, chain *devchain.Chain, signers int) {
	whole := new(big.Int).Div(devchain.InitialUSDC(), big.NewInt(1e6)).String()
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	fmt.Fprintf(w, `
x402 facilitator local stack is up (Ctrl-C stops it)

  facilitator  http://%s   (POST /verify, POST /settle, GET /supported)
  anvil RPC    %s   chain id %d   network %s
  USDC         %s   EIP-712 name %q version %q, 6 decimals
  signer       %s   (dev account #0; %d signer key(s) in all)

funded accounts (10,000 ETH and %s USDC each; anvil's well-known dev keys, never use them elsewhere):
`, addr, chain.RPCURL, chain.ChainID, facilitator.CAIP2(chain.ChainID), chain.USDC.Address.Hex(),
		chain.USDC.Name, chain.USDC.Version, chain.Accounts[0].Address.Hex(), signers, whole)
	for i, a := range chain.Accounts[1:] {
		fmt.Fprintf(w, "  #%d %s  key 0x%s\n", i+1, a.Address.Hex(), hex.EncodeToString(crypto.FromECDSA(a.Key)))
	}
	fmt.Fprintf(w, "\ntry it: scripts/sample-verify.sh http://%s\n", addr)
}
