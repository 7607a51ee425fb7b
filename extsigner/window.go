package extsigner

import (
	"fmt"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// Window bounds what the narrow signer signs per period of time, across its keys, whatever each
// transaction is: the policy proves each call an authorization its payer signed, but not that it
// will succeed (a real authorization resubmitted reverts, and still costs gas), so the gas a
// compromised facilitator can make the keys pay is bounded here. A transaction is an account's
// nonce: the variants signed at one nonce (fee bumps) count once, at the most gas any of them
// has, since only one of them can be mined.
type Window struct {
	// Period is how far back the signer counts.
	Period time.Duration
	// MaxTxs is the most transactions (distinct account nonces) signed within a period.
	MaxTxs int
	// MaxGas is the most gas (the sum of those transactions' gas limits) signed within a period.
	MaxGas uint64
}

// DefaultWindow is the window of a policy that sets none: an hour, 1,000 transactions (a
// settlement or a batch each) and 100,000,000 gas (about 800 lone settlements, or 1,100 in
// batches). At --max-fee-gwei 1 that is at most 0.1 ether an hour.
var DefaultWindow = Window{Period: time.Hour, MaxTxs: 1000, MaxGas: 100_000_000}

// orDefault is w with each zero field DefaultWindow's.
func (w Window) orDefault() Window {
	if w.Period <= 0 {
		w.Period = DefaultWindow.Period
	}
	if w.MaxTxs <= 0 {
		w.MaxTxs = DefaultWindow.MaxTxs
	}
	if w.MaxGas == 0 {
		w.MaxGas = DefaultWindow.MaxGas
	}
	return w
}

// spent is one transaction the window counts.
type spent struct {
	at    time.Time
	from  common.Address
	nonce uint64
	gas   uint64
}

// budget is a window's state: the transactions signed within its last period, oldest first, and
// their gas. It is not safe for concurrent use.
type budget struct {
	w     Window
	spent []spent
	gas   uint64
}

// admit decides whether from's transaction at nonce with gas may be signed at now and, when it
// may, counts it; otherwise the error (wrapping ErrRefused) says which bound and when the
// signer has room again. It is a function of the budget and its arguments only (the clock is
// the caller's).
func (b *budget) admit(now time.Time, from common.Address, nonce, gas uint64) error {
	cut := 0
	for cut < len(b.spent) && !b.spent[cut].at.Add(b.w.Period).After(now) {
		b.gas -= b.spent[cut].gas
		cut++
	}
	b.spent = b.spent[cut:]
	i := slices.IndexFunc(b.spent, func(s spent) bool { return s.from == from && s.nonce == nonce })
	more := gas
	if i >= 0 {
		more = max(gas, b.spent[i].gas) - b.spent[i].gas
	}
	switch {
	case i < 0 && len(b.spent) >= b.w.MaxTxs:
		return fmt.Errorf("%w: %d transactions signed in the last %s, this signer's most per window (--max-txs-per-window); room again in %s",
			ErrRefused, len(b.spent), b.w.Period, b.roomIn(now, 0, true))
	case gas > b.w.MaxGas:
		return fmt.Errorf("%w: gas %d is more than this signer signs per window, %d (--max-gas-per-window)", ErrRefused, gas, b.w.MaxGas)
	case b.gas+more > b.w.MaxGas:
		return fmt.Errorf("%w: gas %d more would take the gas signed in the last %s past %d, this signer's most per window (--max-gas-per-window; %d signed); room again in %s",
			ErrRefused, more, b.w.Period, b.w.MaxGas, b.gas, b.roomIn(now, more, false))
	}
	s := spent{at: now, from: from, nonce: nonce, gas: gas}
	if i >= 0 {
		// A later variant keeps the transaction counted from now: it may be mined later.
		s.gas = max(gas, b.spent[i].gas)
		b.spent = slices.Delete(b.spent, i, i+1)
	}
	b.spent = append(b.spent, s)
	b.gas += more
	return nil
}

// roomIn is how long until enough of the window's transactions age out that one more (tx) or
// gas more fits.
func (b *budget) roomIn(now time.Time, gas uint64, tx bool) time.Duration {
	left := b.gas
	for _, s := range b.spent {
		left -= s.gas
		if tx || left+gas <= b.w.MaxGas {
			return s.at.Add(b.w.Period).Sub(now).Round(time.Second)
		}
	}
	return b.w.Period
}
