package facilitator

import (
	"fmt"
	"strconv"
	"sync"
)

// The finality tags a network's rule may name: a block at or below the block a node reports under
// the tag is final. "finalized" is the consensus layer's finalized checkpoint (on an L2, the L2
// block whose batch is in a finalized L1 block); "safe" is the justified one, earlier and weaker.
const (
	TagFinalized = "finalized"
	TagSafe      = "safe"
)

// TagRead is one node's answer for a finality tag.
type TagRead struct {
	Number uint64
	// OK is false when the read failed, the node answered null, or it does not serve the tag.
	OK bool
}

// FinalPoint is where finality stands as one node answered: the highest final block, and the
// rule that said so.
type FinalPoint struct {
	Block uint64
	// Known is false when no block is known final: a chain shorter than the depth, or a tag
	// answer that cannot be right (above the node's own head, or below a tagged block already
	// seen: finality does not go backwards).
	Known bool
	// Rule is the rule applied: "tag:finalized", "tag:safe" or "depth:<n>" (a tag rule whose tag
	// could not be read falls back to its depth, and says so).
	Rule string
}

// Covers reports whether block is final at p.
func (p FinalPoint) Covers(block uint64) bool { return p.Known && block <= p.Block }

// Validate checks the rule: a known tag or none.
func (f Finality) Validate() error {
	switch f.Tag {
	case "", TagFinalized, TagSafe:
		return nil
	}
	return fmt.Errorf("finality tag %q: want %q, %q or none", f.Tag, TagFinalized, TagSafe)
}

// depth is the rule's depth, at least one (the mined block counts as one).
func (f Finality) depth() uint64 { return max(f.Depth, 1) }

// DepthRule is the rule's name when finality counts confirmations.
func (f Finality) DepthRule() string { return "depth:" + strconv.FormatUint(f.depth(), 10) }

// String names the configured rule: "tag:finalized" (falling back to its depth while the tag
// cannot be read) or "depth:12".
func (f Finality) String() string {
	if f.Tag != "" {
		return "tag:" + f.Tag
	}
	return f.DepthRule()
}

// At is where finality stands on a node whose head is head and whose answer for the rule's tag
// is tag (ignored without a tag), given floor, the highest tagged block read from the network's
// nodes before (0: none). By tag, the tagged block is final, and every block below it; by depth
// (no tag, or a tag that could not be read), the block depth-1 below the head.
func (f Finality) At(head uint64, tag TagRead, floor uint64) FinalPoint {
	if f.Tag != "" && tag.OK {
		p := FinalPoint{Block: tag.Number, Rule: f.String()}
		// A node whose finalized block is above its own head, or below one already reported, is
		// inconsistent (another backend, a broken node): its word says nothing.
		p.Known = tag.Number <= head && tag.Number >= floor
		return p
	}
	d := f.depth()
	if head+1 < d {
		return FinalPoint{Rule: f.DepthRule()}
	}
	return FinalPoint{Block: head + 1 - d, Known: true, Rule: f.DepthRule()}
}

// FinalityFloor remembers the highest tagged block a network's nodes agreed on, so that a node
// whose answer goes back below it is caught (its word is not known). One answer never decides,
// nor moves it: where finality stands is what two answers in a row both reach (a bogus
// "finalized" far ahead, answered once, is outvoted by the honest answer beside it), the floor
// rises to that, and when two answers in a row are below the floor (a bogus floor agreed by a
// lying provider answering twice, say) it is relearned from them, so that honest answers make
// blocks final again. Safe for concurrent use; the zero value has seen nothing.
type FinalityFloor struct {
	mu sync.Mutex
	s  FloorState
}

// FloorState is a FinalityFloor's memory.
type FloorState struct {
	// Floor is the highest tagged block two answers in a row reached (0: none).
	Floor uint64
	// Last is the previous consistent answer (Seen false: none yet).
	Last uint64
	Seen bool
}

// Load is the floor: the highest tagged block agreed (0: none).
func (fl *FinalityFloor) Load() uint64 {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.s.Floor
}

// At is where finality stands after this answer (Step), the floor moved on it.
func (fl *FinalityFloor) At(f Finality, head uint64, tag TagRead) FinalPoint {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	var p FinalPoint
	fl.s, p = f.Step(fl.s, head, tag)
	return p
}

// Step is where finality stands once a node whose head is head answered tag for the rule's tag,
// given what the floor remembers, and the floor after the answer. An answer above the node's own
// head says nothing and changes nothing (without a tag, or while it cannot be read, finality is
// by depth: At). A consistent answer and the one before it agree on the lower of the two, and the
// floor rises to it; two answers in a row below the floor replace it (relearned). Final is every
// block up to the floor, on an answer that reaches it (one below it is a node gone backwards:
// not known). The first answer alone is not known.
func (f Finality) Step(s FloorState, head uint64, tag TagRead) (FloorState, FinalPoint) {
	if f.Tag == "" || !tag.OK || tag.Number > head {
		return s, f.At(head, tag, s.Floor)
	}
	n, last, seen := tag.Number, s.Last, s.Seen
	s.Last, s.Seen = n, true
	if !seen {
		return s, FinalPoint{Rule: f.String()}
	}
	agreed := min(n, last)
	if agreed > s.Floor || (n < s.Floor && last < s.Floor) {
		s.Floor = agreed
	}
	// Final up to the floor, which this answer reaches (a node below it has gone backwards).
	return s, FinalPoint{Block: s.Floor, Known: n >= s.Floor, Rule: f.String()}
}
