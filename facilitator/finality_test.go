package facilitator

import "testing"

func TestFinalityAt(t *testing.T) {
	tag := Finality{Tag: TagFinalized, Depth: 12}
	depth := Finality{Depth: 12}
	cases := []struct {
		name  string
		f     Finality
		head  uint64
		tag   TagRead
		floor uint64
		want  FinalPoint
	}{
		{"depth: 12 deep under head 100", depth, 100, TagRead{}, 0, FinalPoint{Block: 89, Known: true, Rule: "depth:12"}},
		{"depth: a tag read is ignored", depth, 100, TagRead{Number: 99, OK: true}, 0, FinalPoint{Block: 89, Known: true, Rule: "depth:12"}},
		{"depth: chain shorter than the depth", depth, 10, TagRead{}, 0, FinalPoint{Rule: "depth:12"}},
		{"depth: exactly the depth", depth, 11, TagRead{}, 0, FinalPoint{Block: 0, Known: true, Rule: "depth:12"}},
		{"depth 0 counts as 1: the head is final", Finality{}, 7, TagRead{}, 0, FinalPoint{Block: 7, Known: true, Rule: "depth:1"}},
		{"tag: the tagged block, even when shallower than the depth", tag, 100, TagRead{Number: 95, OK: true}, 0, FinalPoint{Block: 95, Known: true, Rule: "tag:finalized"}},
		{"tag: the tagged block, even when deeper than the depth", tag, 100, TagRead{Number: 36, OK: true}, 0, FinalPoint{Block: 36, Known: true, Rule: "tag:finalized"}},
		{"tag: the head itself may be finalized", tag, 100, TagRead{Number: 100, OK: true}, 0, FinalPoint{Block: 100, Known: true, Rule: "tag:finalized"}},
		{"tag: unreadable falls back to depth", tag, 100, TagRead{}, 0, FinalPoint{Block: 89, Known: true, Rule: "depth:12"}},
		{"tag: above the node's own head is not known", tag, 100, TagRead{Number: 101, OK: true}, 0, FinalPoint{Block: 101, Rule: "tag:finalized"}},
		{"tag: gone backwards is not known", tag, 100, TagRead{Number: 40, OK: true}, 41, FinalPoint{Block: 40, Rule: "tag:finalized"}},
		{"tag: at the floor is known", tag, 100, TagRead{Number: 41, OK: true}, 41, FinalPoint{Block: 41, Known: true, Rule: "tag:finalized"}},
		{"tag safe", Finality{Tag: TagSafe, Depth: 3}, 100, TagRead{Number: 68, OK: true}, 0, FinalPoint{Block: 68, Known: true, Rule: "tag:safe"}},
	}
	for _, c := range cases {
		if got := c.f.At(c.head, c.tag, c.floor); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
	p := tag.At(100, TagRead{Number: 36, OK: true}, 0)
	if !p.Covers(36) || !p.Covers(0) || p.Covers(37) {
		t.Errorf("Covers at %+v: 36 and 0 final, 37 not", p)
	}
	if (FinalPoint{Block: 36}).Covers(1) {
		t.Error("an unknown point covers nothing")
	}
}

func TestFinalityValidate(t *testing.T) {
	for _, tag := range []string{"", "finalized", "safe"} {
		if err := (Finality{Tag: tag}).Validate(); err != nil {
			t.Errorf("%q: %v", tag, err)
		}
	}
	for _, tag := range []string{"latest", "pending", "Finalized", "earliest"} {
		if err := (Finality{Tag: tag}).Validate(); err == nil {
			t.Errorf("%q accepted", tag)
		}
	}
	if s := (Finality{Tag: "finalized", Depth: 12}).String(); s != "tag:finalized" {
		t.Errorf("String: %s", s)
	}
	if s := (Finality{Depth: 12}).String(); s != "depth:12" {
		t.Errorf("String: %s", s)
	}
}

// TestFinalityFloor: finality stands, and the floor moves, only on what two answers in a row
// agree on. A node gone backwards (below the agreed floor) is not known, once; a bogus answer far
// ahead, answered once, makes nothing final past the honest answers and does not raise the
// floor; a bogus floor agreed twice in a row is relearned from two honest answers below it, after
// which blocks are final again.
func TestFinalityFloor(t *testing.T) {
	rule := Finality{Tag: TagFinalized, Depth: 4}
	tag := func(n uint64) TagRead { return TagRead{Number: n, OK: true} }
	type read struct {
		head  uint64
		tag   TagRead
		known bool
		block uint64 // where finality stands, when known
		floor uint64
	}
	for _, c := range []struct {
		name  string
		reads []read
	}{
		{"honest answers rising", []read{{100, tag(50), false, 0, 0}, {101, tag(51), true, 50, 50}, {102, tag(52), true, 51, 51}}},
		{"a node gone backwards", []read{{100, tag(50), false, 0, 0}, {100, tag(50), true, 50, 50}, {100, tag(49), false, 0, 50}, {101, tag(51), true, 50, 50}}},
		{"an answer above the node's head", []read{{100, tag(50), false, 0, 0}, {100, tag(50), true, 50, 50}, {100, tag(120), false, 0, 50}, {100, tag(51), true, 50, 50}}},
		{"no answer: depth", []read{{100, tag(50), false, 0, 0}, {100, TagRead{}, true, 97, 0}}},
		{"one bogus answer far ahead, then honest ones", []read{
			{100, tag(50), false, 0, 0}, {100, tag(50), true, 50, 50},
			{10_000, tag(9_000), true, 50, 50}, // self-consistent, and alone: outvoted
			{101, tag(51), true, 51, 51}, {102, tag(52), true, 51, 51}, {103, tag(53), true, 52, 52}}},
		{"a bogus answer twice in a row, then honest ones", []read{
			{100, tag(50), false, 0, 0}, {100, tag(50), true, 50, 50},
			{10_000, tag(9_000), true, 50, 50}, {10_000, tag(9_000), true, 9_000, 9_000},
			{101, tag(51), false, 0, 9_000}, // below the floor: not known, once
			{102, tag(52), true, 51, 51},    // two below it: relearned
			{103, tag(53), true, 52, 52}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var fl FinalityFloor
			var s FloorState
			for i, r := range c.reads {
				var p FinalPoint
				s, p = rule.Step(s, r.head, r.tag)
				if p.Known != r.known || (p.Known && p.Block != r.block) || s.Floor != r.floor {
					t.Fatalf("read %d (head %d, %+v): %+v, floor %d; want known %v at %d, floor %d", i, r.head, r.tag, p, s.Floor, r.known, r.block, r.floor)
				}
				if q := fl.At(rule, r.head, r.tag); q != p || fl.Load() != s.Floor {
					t.Fatalf("read %d: FinalityFloor.At %+v (floor %d), Step %+v (floor %d)", i, q, fl.Load(), p, s.Floor)
				}
			}
		})
	}
	t.Run("a depth rule keeps no floor", func(t *testing.T) {
		s, p := (Finality{Depth: 4}).Step(FloorState{}, 100, tag(90))
		if !p.Known || p.Block != 97 || s != (FloorState{}) {
			t.Fatalf("%+v, %+v", p, s)
		}
	})
}
