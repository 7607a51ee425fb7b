package facilitator

import (
	"fmt"
	"time"
)

// BatchPolicy is a network's batched settlement (issue 16): concurrent settlements on one signer
// key go out as ONE transaction to Multicall3's aggregate3, every call allowed to fail alone, at
// one nonce of the key. The zero value (Max 0) is off: every settlement is its own transaction.
type BatchPolicy struct {
	// Max is the most settlements one batch holds (at most MaxBatch).
	Max int
	// Wait is the longest the first settlement of a batch waits for others (at most MaxBatchWait).
	Wait time.Duration
}

// The bounds of a batch policy: past a hundred calls a batch's gas nears a block's share a node
// takes from one sender; past two seconds the wait is a worse price than the gas saved.
const (
	MaxBatch     = 100
	MaxBatchWait = 2 * time.Second
)

// On reports whether settlements of the network are batched.
func (b BatchPolicy) On() bool { return b.Max > 1 }

// Check says what is wrong with the policy, nil when it is usable.
func (b BatchPolicy) Check() error {
	switch {
	case b.Max < 0 || b.Max > MaxBatch:
		return fmt.Errorf("batch max %d is not in [0, %d]", b.Max, MaxBatch)
	case b.Wait < 0 || b.Wait > MaxBatchWait:
		return fmt.Errorf("batch wait %s is not in [0, %s]", b.Wait, MaxBatchWait)
	}
	return nil
}

// CloseBatch is the rule that closes a batch: it closes when it holds Max settlements, or when
// its first has waited Wait (first is when it arrived, now the engine's clock). Otherwise wait is
// how long until the first has waited Wait. An empty batch never closes.
func (b BatchPolicy) CloseBatch(n int, first, now time.Time) (close bool, wait time.Duration) {
	if n == 0 {
		return false, b.Wait
	}
	if n >= b.Max {
		return true, 0
	}
	if waited := now.Sub(first); waited < b.Wait {
		return false, b.Wait - waited
	}
	return true, 0
}
