package facilitator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLayout holds the house's dependency rules, read from the build itself (go list): imports
// point one way, from cmd/ down to this domain root, and the test benches serve only tests. A
// change that breaks a rule fails here rather than in a reviewer's reading.
func TestLayout(t *testing.T) {
	pkgs := listPackages(t)
	const mod = "github.com/x402-facilitator/x402-facilitator/"
	ours := func(imports []string) []string {
		var out []string
		for _, p := range imports {
			if strings.HasPrefix(p, mod) {
				out = append(out, strings.TrimPrefix(p, mod))
			}
		}
		return out
	}
	// What each package may import of ours, and nothing else: every package has its line, so a
	// new package or a new arrow between two is a decision written here, not an accident.
	only := map[string][]string{
		// The bottom of the house.
		"facilitator":          {},
		"migrations":           {},
		"multicall3":           {},
		"metrics":              {},
		"official":             {},
		"facilitator/postgres": {"facilitator", "migrations"},
		"eip3009":              {"facilitator"},
		"ethrpc":               {"facilitator"},
		"auth":                 {"facilitator"},
		"client":               {"facilitator"},
		"notify":               {"facilitator"},
		"paymentid":            {"facilitator"},
		// The narrow signer reads a settlement's call and a batch's (Multicall3).
		"extsigner": {"eip3009", "multicall3"},
		// The presets and the start-up check of a network against its chain.
		"chains": {"eip3009", "ethrpc", "facilitator"},
		// The ledger-against-chain rule: a row, a receipt, the token's logs.
		"ledgercheck": {"eip3009", "facilitator"},
		// The services over the chain: each reads it through ethrpc, never through the ledger's SQL.
		"verify":    {"eip3009", "ethrpc", "facilitator"},
		"status":    {"eip3009", "ethrpc", "facilitator"},
		"indexer":   {"eip3009", "ethrpc", "facilitator"},
		"settle":    {"eip3009", "ethrpc", "facilitator", "multicall3"},
		"reconcile": {"ethrpc", "facilitator", "settle"},
		// The operations overview reads through interfaces of its own (the engine's and the
		// indexers' health types are theirs): no SQL, no transport.
		"ops": {"eip3009", "ethrpc", "facilitator", "indexer", "ledgercheck", "settle"},
		// The web console's pages: the domain's status answers and the forms status parses, and
		// the operations overview's snapshot.
		"console": {"facilitator", "ops", "status"},
		// The HTTP transport: the services it serves come in through interfaces of its own.
		"api": {"auth", "facilitator", "notify", "ops", "status"},
		// The binaries: the production one wires every service; the dev one wires the dev tools
		// and runs the production binary as a child.
		"cmd/facilitator": {"api", "auth", "chains", "client", "console", "ethrpc", "extsigner", "facilitator",
			"facilitator/postgres", "indexer", "metrics", "multicall3", "notify", "ops", "paymentid", "reconcile", "settle", "status", "verify"},
		"cmd/facilitator-dev": {"demo", "devchain", "facilitator", "facilitator/postgres", "loadgen", "official"},
		// The dev tools.
		"devchain": {"ethrpc"},
		"demo":     {"client", "devchain", "eip3009", "facilitator", "ledgercheck"},
		// The load generator reaches the ledger through interfaces of its own, wired by the dev
		// binary as cmd/facilitator wires the services.
		"loadgen": {"devchain", "eip3009", "ethrpc", "facilitator", "indexer", "notify", "official"},
		// The test benches (imported by tests only; see below).
		"settle/ledgertest": {"facilitator", "settle"},
		"settle/settlesim":  {"eip3009", "ethrpc", "facilitator", "multicall3", "settle"},
		"stacktest": {"api", "devchain", "eip3009", "ethrpc", "extsigner", "facilitator", "facilitator/postgres",
			"indexer", "paymentid", "settle", "status", "verify"},
		// Packages of tests and documents only.
		"deploy":  {},
		"docs":    {},
		"interop": {},
	}
	// Packages nothing may import but the binary's wiring and the test bench (which stands at the
	// top beside it, building the same stacks for tests), and the binary itself.
	top := map[string][]string{"api": {"cmd/facilitator", "stacktest"}, "cmd/facilitator": {}, "cmd/facilitator-dev": {},
		// The dev tools: only the dev binary (and the tools built on the local chain) link them,
		// never the production binary (cmd/facilitator's TestProductionLinksNoDevTool reads its
		// whole dependency list).
		"devchain": {"cmd/facilitator-dev", "demo", "loadgen", "stacktest"},
		"loadgen":  {"cmd/facilitator-dev"},
		"official": {"cmd/facilitator-dev", "loadgen"},
		"demo":     {"cmd/facilitator-dev"},
	}
	// The third-party layers the domain root must not know (it is the wire and the rules).
	foreign := []string{"github.com/labstack/echo", "github.com/jackc/pgx", "github.com/ethereum/go-ethereum/ethclient", "github.com/ethereum/go-ethereum/rpc"}

	seen := map[string]bool{}
	for _, p := range pkgs {
		name := strings.TrimPrefix(p.ImportPath, mod)
		seen[name] = true
		imports := ours(p.Imports)
		allowed, ok := only[name]
		if !ok {
			t.Errorf("package %s has no rule: write what it may import", name)
		}
		if ok {
			for _, imp := range imports {
				if !slices.Contains(allowed, imp) {
					t.Errorf("%s imports %s; it may import only %v of this module", name, imp, allowed)
				}
			}
		}
		if name == "facilitator" {
			for _, imp := range p.Imports {
				for _, f := range foreign {
					if strings.HasPrefix(imp, f) {
						t.Errorf("the domain root imports %s", imp)
					}
				}
			}
		}
		for _, imp := range imports {
			if users, ok := top[imp]; ok && !slices.Contains(users, name) {
				t.Errorf("%s imports %s; only %v may", name, imp, users)
			}
			// A package whose name ends in "test", and the simulator's world, are test benches:
			// only tests, and the other benches, import them.
			if isBench(imp) && !isBench(name) {
				t.Errorf("%s (product code) imports the test bench %s", name, imp)
			}
		}
	}
	for name := range top {
		if !seen[name] {
			t.Errorf("package %s is gone: update the rules", name)
		}
	}
	for name := range only {
		if !seen[name] {
			t.Errorf("package %s is gone: update the rules", name)
		}
	}
}

// isBench reports whether a package is a test bench.
func isBench(name string) bool {
	return strings.HasSuffix(name, "test") || name == "settle/settlesim"
}

type listed struct {
	ImportPath string
	Imports    []string
}

func listPackages(t *testing.T) []listed {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-json", "github.com/x402-facilitator/x402-facilitator/...")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; the module has more", len(pkgs))
	}
	return pkgs
}
