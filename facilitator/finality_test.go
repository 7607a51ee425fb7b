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

func TestFinalityFloor(t *testing.T) {
	var fl FinalityFloor
	rule := Finality{Tag: TagFinalized, Depth: 4}
	if p := fl.At(rule, 100, TagRead{Number: 50, OK: true}); !p.Known || fl.Load() != 50 {
		t.Fatalf("first answer: %+v, floor %d", p, fl.Load())
	}
	if p := fl.At(rule, 100, TagRead{Number: 49, OK: true}); p.Known || fl.Load() != 50 {
		t.Fatalf("an answer gone backwards: %+v, floor %d; want not known, floor kept", p, fl.Load())
	}
	if p := fl.At(rule, 100, TagRead{Number: 120, OK: true}); p.Known || fl.Load() != 50 {
		t.Fatalf("an answer above the head: %+v, floor %d; want not known, floor kept", p, fl.Load())
	}
	if p := fl.At(rule, 100, TagRead{}); !p.Known || p.Rule != "depth:4" || fl.Load() != 50 {
		t.Fatalf("no answer: %+v, floor %d; want depth, floor kept", p, fl.Load())
	}
	if p := fl.At(rule, 100, TagRead{Number: 60, OK: true}); !p.Known || fl.Load() != 60 {
		t.Fatalf("a later answer: %+v, floor %d", p, fl.Load())
	}
}
