package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"strings"
	"sync"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// printer writes the story; the merchant prints from its handler's goroutine.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func (p *printer) step(n int, title string) { p.printf("\n%2d. %s\n", n, title) }

func (p *printer) kv(label, value string) {
	if label == "" && value == "" {
		p.printf("\n")
		return
	}
	p.printf("      %-16s %s\n", label, value)
}

// short abbreviates a hash or an address for the comparison table (full values are printed above).
func short(h string) string {
	if len(h) <= 20 {
		return h
	}
	return h[:10] + "…" + h[len(h)-8:]
}

func describeStatus(st *facilitator.AuthorizationStatus) string {
	s := st.State
	if st.SettledBy != "" {
		s += " by the " + st.SettledBy
	}
	if st.Transaction != "" {
		s += ", transaction " + st.Transaction
	}
	if st.BlockNumber != 0 {
		s += fmt.Sprintf(", block %d", st.BlockNumber)
	}
	if st.Final {
		s += ", final"
	}
	if st.PaymentID != "" {
		s += ", payment id " + st.PaymentID
	}
	return s + " (basis: " + st.Basis + ")"
}

// usdc writes atomic units (6 decimals) as "1,000,000.00 USDC"; signed adds a + to positives.
func usdc(atomic *big.Int, signed bool) string {
	sign := ""
	switch {
	case atomic.Sign() < 0:
		sign = "-"
	case signed && atomic.Sign() > 0:
		sign = "+"
	}
	whole, frac := new(big.Int).QuoRem(new(big.Int).Abs(atomic), big.NewInt(1_000_000), new(big.Int))
	w := whole.String()
	for i := len(w) - 3; i > 0; i -= 3 {
		w = w[:i] + "," + w[i:]
	}
	f := strings.TrimRight(fmt.Sprintf("%06d", frac.Int64()), "0")
	for len(f) < 2 {
		f += "0"
	}
	return sign + w + "." + f + " USDC"
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain types are marshalled
	}
	return b
}
