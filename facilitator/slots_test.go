package facilitator

import "testing"

// TestSlots: an owner past its share is refused with the key's reason whatever the total; an
// owner within it is refused only when every slot is taken; a slot given back is taken again.
func TestSlots(t *testing.T) {
	s := NewSlots(3, 2)
	take := func(owner, want string) {
		t.Helper()
		err := s.Take(owner)
		if got := ErrorReason(err, ""); got != want {
			t.Fatalf("Take(%q) = %v, want reason %q", owner, err, want)
		}
		if err != nil && ErrorRetryAfter(err) <= 0 {
			t.Fatalf("Take(%q) refused without a Retry-After", owner)
		}
	}
	take("C", "")
	take("C", "")
	take("C", ReasonTooManyStreamsForKey)
	take("B", "")
	take("A", ReasonTooManyStreams)
	take("C", ReasonTooManyStreamsForKey) // its own share first, though every slot is taken
	if ErrorCode(s.Take("C")) != ELimited || ErrorCode(s.Take("A")) != EUnavailable {
		t.Fatalf("the key's refusal must be a limit (429), the total's an unavailability (503)")
	}
	s.Give("C")
	take("A", "")
	if s.Open() != 3 {
		t.Fatalf("%d slots open, want 3", s.Open())
	}
}
