package indexer

import (
	"context"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/x402-facilitator/x402-facilitator/facilitator"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
)

func TestNewRangeSizer(t *testing.T) {
	for _, c := range []struct {
		initial, max      uint64
		wantSize, wantMax uint64
	}{
		{0, 0, 10_000, 10_000},
		{1000, 0, 1000, 10_000},
		{0, 500, 500, 500},
		{20_000, 5000, 5000, 5000},
		{1, 1, 1, 1},
	} {
		r := newRangeSizer(c.initial, c.max)
		if r.size != c.wantSize || r.max != c.wantMax || r.min != 1 {
			t.Errorf("newRangeSizer(%d, %d) = size %d min %d max %d, want size %d min 1 max %d",
				c.initial, c.max, r.size, r.min, r.max, c.wantSize, c.wantMax)
		}
	}
}

func TestRangeSizerGrow(t *testing.T) {
	r := newRangeSizer(3, 20)
	var sizes []uint64
	for r.grow() {
		sizes = append(sizes, r.size)
	}
	if want := []uint64{6, 12, 20}; !equal(sizes, want) {
		t.Errorf("grew through %v, want %v", sizes, want)
	}
	if r.grow() || r.size != 20 {
		t.Errorf("grow at max: size %d", r.size)
	}
}

func TestRangeSizerShrink(t *testing.T) {
	hint := func(from, to uint64) error {
		return errors.New("Log response size exceeded. this block range should work: [0x" +
			big.NewInt(int64(from)).Text(16) + ", 0x" + big.NewInt(int64(to)).Text(16) + "]")
	}
	for _, c := range []struct {
		name     string
		size     uint64
		from, to uint64
		err      error
		ok       bool
		wantSize uint64
	}{
		{"no hint halves", 1000, 5000, 5999, errors.New("query returned more than 10000 results"), true, 500},
		{"odd size halves down", 7, 1, 7, errors.New("too many"), true, 3},
		{"hint from the same block is taken", 1000, 5000, 5999, hint(5000, 5310), true, 311},
		{"hint of one block", 1000, 5000, 5999, hint(5000, 5000), true, 1},
		{"hint from another block halves", 1000, 5000, 5999, hint(4000, 4100), true, 500},
		{"hint not smaller than the refused range halves", 1000, 5000, 5999, hint(5000, 5999), true, 500},
		{"hint larger than the refused range halves", 1000, 5000, 5999, hint(5000, 7000), true, 500},
		{"inverted hint halves", 1000, 5000, 5999, hint(5000, 4000), true, 500},
		{"two halves to one", 2, 10, 11, errors.New("limit exceeded"), true, 1},
		{"cannot go below one block", 1, 10, 10, errors.New("limit exceeded"), false, 1},
		{"a hint cannot shrink below one either", 1, 10, 10, hint(10, 10), false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRangeSizer(c.size, 10_000)
			if ok := r.shrink(c.from, c.to, c.err); ok != c.ok || r.size != c.wantSize {
				t.Errorf("shrink(%d, %d, %q) from %d = %v, size %d; want %v, size %d", c.from, c.to, c.err, c.size, ok, r.size, c.ok, c.wantSize)
			}
		})
	}
}

func TestRangeHint(t *testing.T) {
	for _, c := range []struct {
		msg      string
		from, to uint64
		ok       bool
	}{
		// Alchemy
		{"Log response size exceeded. You can make eth_getLogs requests with up to a 2K block range and no limit on the response size, or you can request any block range with a cap of 10K logs in the response. Based on your parameters, this block range should work: [0x1, 0x4e7]", 1, 0x4e7, true},
		// Infura, upper-case hex digits
		{"query returned more than 10000 results. Try with this block range [0x2E3A4C0, 0x2E3A7D2].", 0x2E3A4C0, 0x2E3A7D2, true},
		// decimal, no space
		{"block range too large, try [100,199]", 100, 199, true},
		{"block range too large, try [100, 199]", 100, 199, true},
		// none
		{"query returned more than 10000 results", 0, 0, false},
		{"exceed maximum block range: 5000", 0, 0, false},
		{"[0x1]", 0, 0, false},
		{"[abc, def]", 0, 0, false},
		// too big for uint64
		{"try [0x1, 0x10000000000000000]", 0, 0, false},
		{"try [1, 99999999999999999999999]", 0, 0, false},
		// the first bracketed pair wins
		{"try [0x10, 0x20] or [0x30, 0x40]", 0x10, 0x20, true},
	} {
		from, to, ok := rangeHint(errors.New(c.msg))
		if ok != c.ok || from != c.from || to != c.to {
			t.Errorf("rangeHint(%q) = %d, %d, %v; want %d, %d, %v", c.msg, from, to, ok, c.from, c.to, c.ok)
		}
	}
	if _, _, ok := rangeHint(nil); ok {
		t.Error("rangeHint(nil) found a hint")
	}
}

func TestTooLarge(t *testing.T) {
	for _, msg := range []string{
		"query returned more than 10000 results",
		"Log response size exceeded. this block range should work: [0x1, 0x4e7]",
		"block range is too large",
		"exceed maximum block range: 5000",
		"eth_getLogs is limited to a 10,000 range",
		"response size should not greater than 10000000 bytes",
		"Query timeout exceeded. Consider reducing your block range.",
		"request timed out: timeout",
		"context deadline exceeded", // a range too heavy to serve in time
		"too many logs",
		// A hinted range ending at block 0x429 (1065): not HTTP 429. Read as a rate limit, the
		// indexer retried the refused range for ever (TestLiveRangeRespectsProviderLimits, when
		// the chain's head put the hint there).
		"Log response size exceeded. You can make eth_getLogs requests with up to a 20 block range. Based on your parameters, this block range should work: [0x416, 0x429]",
		"this block range should work: [1, 429]x",
	} {
		if !tooLarge(errors.New(msg)) {
			t.Errorf("tooLarge(%q) = false", msg)
		}
	}
	for _, msg := range []string{
		"execution reverted",
		"connection refused",
		"header not found",
		"unknown block",
		"invalid argument 0: hex string without 0x prefix",
		"429 Too Many Requests",
		"HTTP 429: slow down",
		"status code 429",
		"rate limit exceeded for range queries",
		"exceeded compute units per second capacity",
	} {
		if tooLarge(errors.New(msg)) {
			t.Errorf("tooLarge(%q) = true", msg)
		}
	}
	if tooLarge(nil) {
		t.Error("tooLarge(nil) = true")
	}
}

// TestTooLargeIgnoresRateLimits: a provider's rate limit says nothing about the range, and shrinking
// on it (down to one block) turns a burst of 429s into many more requests.
func TestTooLargeIgnoresRateLimits(t *testing.T) {
	for _, msg := range []string{
		"429 Too Many Requests",
		"rate limit exceeded",
		"Your app has exceeded its compute units per second capacity",
		"daily request count exceeded, request rate limited",
	} {
		if tooLarge(errors.New(msg)) {
			t.Errorf("tooLarge(%q) = true", msg)
		}
	}
}

func TestDecode(t *testing.T) {
	token := common.HexToAddress("0x036CbD53842c5426634e7929541eC2318f3dCF7e")
	from := common.HexToAddress("0x1111111111111111111111111111111111111111")
	to := common.HexToAddress("0x2222222222222222222222222222222222222222")
	nonce := common.HexToHash("0xabcdef")
	pad := func(a common.Address) common.Hash { return common.BytesToHash(a[:]) }
	value := common.LeftPadBytes(big.NewInt(1_500_000).Bytes(), 32)
	blockHash := common.HexToHash("0xb10c")
	base := func(i uint) types.Log {
		return types.Log{Address: token, BlockNumber: 42, BlockHash: blockHash, BlockTimestamp: 1_700_000_000,
			TxHash: common.BigToHash(big.NewInt(int64(100 + i))), Index: i}
	}
	with := func(i uint, topics []common.Hash, data []byte, edit ...func(*types.Log)) types.Log {
		l := base(i)
		l.Topics, l.Data = topics, data
		for _, e := range edit {
			e(&l)
		}
		return l
	}
	logs := []types.Log{
		with(0, []common.Hash{eip3009.TransferTopic, pad(from), pad(to)}, value),                                                     // kept
		with(1, []common.Hash{eip3009.AuthorizationUsedTopic, pad(from), nonce}, nil),                                                // kept
		with(2, []common.Hash{eip3009.AuthorizationCanceledTopic, pad(to), nonce}, nil, func(l *types.Log) { l.BlockTimestamp = 0 }), // kept, no time
		with(3, []common.Hash{eip3009.TransferTopic, pad(from), pad(to), common.BigToHash(big.NewInt(7))}, nil),                      // ERC-721
		with(4, []common.Hash{eip3009.TransferTopic, pad(from)}, append(common.LeftPadBytes(to[:], 32), value...)),                   // unindexed to
		with(5, []common.Hash{eip3009.TransferTopic, pad(from), pad(to)}, nil),                                                       // no value
		with(6, []common.Hash{eip3009.TransferTopic, pad(from), pad(to)}, append(value, value...)),                                   // 64 bytes
		with(7, []common.Hash{eip3009.AuthorizationUsedTopic, pad(from)}, nonce[:]),                                                  // unindexed nonce
		with(8, []common.Hash{eip3009.AuthorizationCanceledTopic, pad(from), nonce, nonce}, nil),                                     // extra topic
		with(9, nil, value), // anonymous
		with(10, []common.Hash{common.HexToHash("0xdead"), pad(from), pad(to)}, value),                                                        // other event
		with(11, []common.Hash{eip3009.TransferTopic, pad(from), pad(to)}, value, func(l *types.Log) { l.Removed = true }),                    // removed
		with(12, []common.Hash{eip3009.TransferTopic, pad(to), pad(from)}, common.LeftPadBytes(nil, 32), func(l *types.Log) { l.Index = 12 }), // zero value, kept
	}
	ev := Decode(logs)
	if ev.Len() != 4 || len(ev.Transfers) != 2 || len(ev.Auths) != 2 {
		t.Fatalf("decoded %d transfers and %d auths, want 2 and 2: %+v", len(ev.Transfers), len(ev.Auths), ev)
	}
	at := time.Unix(1_700_000_000, 0).UTC()
	pos := func(i uint, tm time.Time) facilitator.LogPosition {
		return facilitator.LogPosition{BlockNumber: 42, BlockHash: blockHash, BlockTime: tm, TxHash: common.BigToHash(big.NewInt(int64(100 + i))), LogIndex: i, Token: token}
	}
	t0 := ev.Transfers[0]
	if t0.LogPosition != pos(0, at) || t0.From != from || t0.To != to || t0.Value.Int64() != 1_500_000 {
		t.Errorf("transfer 0: %+v", t0)
	}
	if t1 := ev.Transfers[1]; t1.LogPosition != pos(12, at) || t1.From != to || t1.To != from || t1.Value.Sign() != 0 {
		t.Errorf("transfer 12: %+v", t1)
	}
	if a := ev.Auths[0]; a.LogPosition != pos(1, at) || a.Canceled || a.Authorizer != from || a.Nonce != nonce {
		t.Errorf("auth used: %+v", a)
	}
	if a := ev.Auths[1]; a.LogPosition != pos(2, time.Time{}) || !a.Canceled || a.Authorizer != to || a.Nonce != nonce {
		t.Errorf("auth canceled: %+v", a)
	}
	if ev := Decode(nil); ev.Len() != 0 {
		t.Errorf("Decode(nil) = %+v", ev)
	}
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCommonAncestor: the ancestor search reads the kept window top down, at most ancestorChunk
// headers a request (a window thousands of blocks long under a lagging finality tag is more than
// a provider takes in one batch), and stops at the first kept block still canonical.
func TestCommonAncestor(t *testing.T) {
	hash := func(n uint64, branch byte) common.Hash { return common.Hash{branch, byte(n >> 8), byte(n)} }
	var kept []facilitator.Block
	for n := uint64(1000); n <= 1450; n++ {
		kept = append(kept, facilitator.Block{Number: n, Hash: hash(n, 'a')})
	}
	for _, c := range []struct {
		name     string
		forkAt   uint64 // canonical blocks from forkAt on are on branch b
		want     uint64 // 0: none
		requests int
	}{
		{"a shallow reorg", 1448, 1447, 1},
		{"past one chunk", 1300, 1299, 2},
		{"the whole window", 900, 0, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			var reqs []uint64
			headers := func(_ context.Context, from, to uint64) ([]facilitator.Block, error) {
				if to+1-from > ancestorChunk {
					t.Fatalf("a request for %d headers", to+1-from)
				}
				reqs = append(reqs, from)
				var out []facilitator.Block
				for n := from; n <= to; n++ {
					b := byte('a')
					if n >= c.forkAt {
						b = 'b'
					}
					out = append(out, facilitator.Block{Number: n, Hash: hash(n, b)})
				}
				return out, nil
			}
			got, err := commonAncestor(context.Background(), kept, 1460, headers)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == 0 && got != nil, c.want != 0 && (got == nil || got.Number != c.want):
				t.Fatalf("ancestor %+v, want %d", got, c.want)
			case len(reqs) != c.requests:
				t.Fatalf("%d requests (from %v), want %d", len(reqs), reqs, c.requests)
			}
		})
	}
}
