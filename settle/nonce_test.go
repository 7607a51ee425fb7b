package settle

import "testing"

// TestLowestFree: the key's next nonce after a load is the lowest from the chain's mined nonce
// on that no settlement holds, a gap included.
func TestLowestFree(t *testing.T) {
	for _, c := range []struct {
		name   string
		latest uint64
		held   []uint64
		want   uint64
	}{
		{"nothing held: the chain's nonce", 7, nil, 7},
		{"past the ledger's run", 7, []uint64{7, 8, 9}, 10},
		{"a gap below the ledger's highest", 7, []uint64{7, 9, 10}, 8},
		{"the gap is at the chain's nonce", 7, []uint64{8, 9}, 7},
		{"rows below the chain's nonce do not count", 7, []uint64{3, 4, 7}, 8},
	} {
		if got := lowestFree(c.latest, c.held); got != c.want {
			t.Errorf("%s: lowestFree(%d, %v) = %d, want %d", c.name, c.latest, c.held, got, c.want)
		}
	}
}
