package main

import (
	"fmt"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// BatchConfig is a network's optional "batch" entry: {"max": 20, "wait": "150ms"} batches up to
// max concurrent settlements of one signer key into one Multicall3 transaction, closed when full
// or when its first settlement has waited wait.
type BatchConfig struct {
	Max  int    `json:"max"`
	Wait string `json:"wait,omitempty"`
}

// policy is the entry as the domain's policy (nil: off), or why it is unusable.
func (bc *BatchConfig) policy() (facilitator.BatchPolicy, error) {
	if bc == nil {
		return facilitator.BatchPolicy{}, nil
	}
	p := facilitator.BatchPolicy{Max: bc.Max}
	if bc.Max < 2 {
		return p, fmt.Errorf("max %d: a batch holds at least 2 settlements (leave \"batch\" out for none)", bc.Max)
	}
	if bc.Wait != "" {
		d, err := time.ParseDuration(bc.Wait)
		if err != nil {
			return p, fmt.Errorf("wait %q: %w", bc.Wait, err)
		}
		p.Wait = d
	}
	return p, p.Check()
}

// batchText is how check-config reports a network's batching.
func batchText(p facilitator.BatchPolicy) string {
	if !p.On() {
		return "off"
	}
	return fmt.Sprintf("up to %d settlements per Multicall3 transaction, closed after %s", p.Max, p.Wait)
}
