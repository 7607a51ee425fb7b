package reconcile

import (
	"fmt"
	"testing"
)

func TestNonceHoles(t *testing.T) {
	none := func(uint64) bool { return false }
	for _, c := range []struct {
		name    string
		count   uint64
		held    []uint64
		window  uint64
		scanned func(uint64) bool
		want    string
	}{
		{"nothing sent", 0, nil, 8, none, "[]"},
		{"all held", 3, []uint64{0, 1, 2}, 8, none, "[]"},
		{"held above the count (open rows) are no holes", 2, []uint64{0, 1, 2, 3}, 8, none, "[]"},
		{"the newest lost", 4, []uint64{0, 1}, 8, none, "[2 3]"},
		{"a hole below new traffic", 5, []uint64{0, 1, 3, 4}, 8, none, "[2]"},
		{"a batch's slots hold one nonce", 4, []uint64{0, 0, 1, 3, 3}, 8, none, "[2]"},
		{"nothing held", 3, nil, 8, none, "[0 1 2]"},
		{"only the window", 10, []uint64{9}, 4, none, "[6 7 8]"},
		{"holes looked for already", 6, []uint64{0, 3}, 8, func(n uint64) bool { return n == 1 || n == 4 }, "[2 5]"},
	} {
		if got := fmt.Sprint(nonceHoles(c.count, c.held, c.window, c.scanned)); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
