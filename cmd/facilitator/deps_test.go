package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestProductionLinksNoDevTool holds the line between the two binaries: the production binary's
// dependencies, as the build itself lists them, include no package of this module that runs a
// local chain, generates load, drives the official facilitator or tells the demo. Those belong to
// cmd/facilitator-dev; an import that pulls one in here fails.
func TestProductionLinksNoDevTool(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go is not on PATH: %v", err)
		}
		t.Skipf("go is not on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	const mod = "github.com/x402-facilitator/x402-facilitator/"
	deps := strings.Fields(string(out))
	ours := 0
	for _, p := range deps {
		name, ok := strings.CutPrefix(p, mod)
		if !ok {
			continue
		}
		ours++
		for _, dev := range []string{"loadgen", "devchain", "official", "demo"} {
			if name == dev || strings.HasPrefix(name, dev+"/") {
				t.Errorf("the production binary links %s, a dev tool's package (it belongs to cmd/facilitator-dev)", name)
			}
		}
	}
	// The list must be the real one: the binary links the API and the settlement engine.
	if ours < 10 || !strings.Contains(string(out), mod+"api\n") || !strings.Contains(string(out), mod+"settle\n") {
		t.Fatalf("go list -deps listed %d packages of this module, without api or settle: not the binary's list\n%s", ours, out)
	}
}
