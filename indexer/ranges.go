package indexer

import (
	"regexp"
	"strconv"
	"strings"
)

// rangeSizer sizes eth_getLogs block ranges: it grows after a success and shrinks after a
// provider refuses a range as too large, using the provider's hinted range when the error names
// one (Alchemy, Infura, QuickNode and others do) and halving otherwise.
type rangeSizer struct {
	size, min, max uint64
}

func newRangeSizer(initial, max uint64) *rangeSizer {
	if max == 0 {
		max = 10_000
	}
	if initial == 0 || initial > max {
		initial = max
	}
	return &rangeSizer{size: initial, min: 1, max: max}
}

// grew doubles the size after a success, up to max; it reports whether it changed.
func (r *rangeSizer) grow() bool {
	if r.size >= r.max {
		return false
	}
	r.size = min(r.size*2, r.max)
	return true
}

// shrink adapts the size after a refusal of [from, to]: to the hint when the error gives a range
// starting at from, else to half. It reports false when the size cannot go lower.
func (r *rangeSizer) shrink(from, to uint64, err error) bool {
	if hf, ht, ok := rangeHint(err); ok && hf == from && ht >= hf && ht < to {
		r.size = ht - hf + 1
		return true
	}
	if r.size <= r.min {
		return false
	}
	r.size = max(r.size/2, r.min)
	return true
}

// tooLarge recognises providers' "range too large / too many results / response too big" errors.
func tooLarge(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(err.Error())
	// Rate limits are not about the range: shrinking would only slow the backfill down. The
	// status 429 counts only as a number of its own, and never inside a hinted range: a hint
	// ending at block 0x429 (or 429) is a range refusal, and reading it as a rate limit retried
	// the same range for ever.
	if httpTooMany.MatchString(hintPattern.ReplaceAllString(msg, "[]")) {
		return false
	}
	for _, s := range []string{"rate limit", "too many requests", "compute units", "capacity", "throughput"} {
		if strings.Contains(msg, s) {
			return false
		}
	}
	for _, s := range []string{"range", "too many", "limit", "exceed", "too large", "size", "10000", "query returned more than", "timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

var httpTooMany = regexp.MustCompile(`\b429\b`)

var hintPattern = regexp.MustCompile(`\[(0x[0-9a-fA-F]+|\d+),\s*(0x[0-9a-fA-F]+|\d+)\]`)

// rangeHint extracts a suggested [from, to] range from an error message, e.g. Alchemy's "this
// block range should work: [0x1, 0x4e7]".
func rangeHint(err error) (from, to uint64, ok bool) {
	if err == nil {
		return 0, 0, false
	}
	m := hintPattern.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, 0, false
	}
	f, err1 := parseNum(m[1])
	t, err2 := parseNum(m[2])
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return f, t, true
}

func parseNum(s string) (uint64, error) {
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		return strconv.ParseUint(s[2:], 16, 64)
	}
	return strconv.ParseUint(s, 10, 64)
}
