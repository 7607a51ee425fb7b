package settle

import (
	"context"
	"errors"
	"math/big"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// What a settlement's transaction pays, and when and by how much it pays more. A new transaction
// is priced under the network's fee policy (priceFees) from one reading of the network's fees
// (fees). The bump rule is all in this file: when an unmined transaction is replaced with higher
// fees (dueForBump: BumpAfter since it was signed, or a node called it underpriced, the flag the
// broadcaster raises with wantBump; bumpOnReads: only on pinned reads at the highest head seen,
// and twice; bumpVetoed: not when a later head was told of since those reads), by how much
// (BumpFees: the policy's BumpPercent above the old fees and at least the current price, within
// the max fee), and how the replacement is signed and recorded before it is sent (bump).

// Fees are a transaction's tip and fee cap. A legacy (type-0) transaction's gas price is both:
// that is how nodes read one (a gas price pays its whole self to the block producer).
type Fees struct {
	TipCap *big.Int
	FeeCap *big.Int
}

// feeReading is what one round trip told of a network's fees.
type feeReading struct {
	// history is eth_feeHistory's answer; nil: the node has none (the fallback reads price).
	history *feeHistory
	// latestBaseFee is the latest block's base fee (the fallback's base fee); nil: not read.
	latestBaseFee *big.Int
	// nodeTip is eth_maxPriorityFeePerGas; nil: the node has no such method.
	nodeTip *big.Int
	// gasPrice is eth_gasPrice (legacy pricing).
	gasPrice *big.Int
}

// feeHistory is the part of an eth_feeHistory answer pricing reads: per block, the share of its
// gas used and its tip at the policy's percentile; and the base fees, the last of which is the
// next block's.
type feeHistory struct {
	baseFees     []*big.Int // len(rewards)+1
	gasUsedRatio []float64
	rewards      []*big.Int // the percentile's reward, per block
}

// errFeesAboveCap is wrapped by the refusal of a settlement the network's max fee cannot pay for.
var errFeesAboveCap = errors.New("settle: the network's fees are above its max fee")

// errNoFeeReading: the read told nothing to price with.
var errNoFeeReading = errors.New("settle: no base fee or gas price in the fee reading")

// priceFees prices a new transaction under policy p (defaults applied) from reading r.
//
// EIP-1559: the tip is the median, over the blocks of the history that carried transactions, of
// each block's reward at the policy's percentile (empty blocks say nothing about what it takes
// to be included), or the node's eth_maxPriorityFeePerGas when no block did, clamped to
// [MinTip, MaxTip]; the fee cap is FeeCapPercent of the next block's base fee plus the tip, cut
// down to MaxFee. A node without eth_feeHistory is priced from the latest block's base fee and
// its eth_maxPriorityFeePerGas. Legacy: the node's gas price, at least MinTip.
//
// When even the next base fee plus the tip exceeds MaxFee, no transaction within the limit could
// be mined: the answer is the fees at the limit and errFeesAboveCap (a bump may still go up to
// the limit; a new settlement is refused).
func priceFees(p facilitator.FeePolicy, r feeReading) (Fees, error) {
	f, _, err := price(p, r)
	return f, err
}

// price is priceFees, with the least fee cap (or gas price) a transaction could be mined at
// under p now, whatever the max fee: the next base fee plus the tip, or the gas price.
func price(p facilitator.FeePolicy, r feeReading) (Fees, *big.Int, error) {
	if p.Legacy {
		if r.gasPrice == nil {
			return Fees{}, nil, errNoFeeReading
		}
		price := clampTip(r.gasPrice, p.MinTip, nil)
		if p.MaxFee != nil && price.Cmp(p.MaxFee) > 0 {
			return Fees{TipCap: new(big.Int).Set(p.MaxFee), FeeCap: new(big.Int).Set(p.MaxFee)}, price, errFeesAboveCap
		}
		return Fees{TipCap: price, FeeCap: new(big.Int).Set(price)}, price, nil
	}
	var baseFee, tip *big.Int
	if h := r.history; h != nil && len(h.baseFees) > 0 {
		baseFee = h.baseFees[len(h.baseFees)-1]
		var used []*big.Int
		for i, reward := range h.rewards {
			if i < len(h.gasUsedRatio) && h.gasUsedRatio[i] > 0 && reward != nil {
				used = append(used, reward)
			}
		}
		tip = median(used)
	} else {
		baseFee = r.latestBaseFee
	}
	if baseFee == nil {
		return Fees{}, nil, errNoFeeReading
	}
	if tip == nil {
		tip = r.nodeTip
	}
	if tip == nil {
		tip = new(big.Int) // a node with neither: the floor applies
	}
	tip = clampTip(tip, p.MinTip, p.MaxTip)
	feeCap := new(big.Int).Mul(baseFee, new(big.Int).SetUint64(p.FeeCapPercent))
	feeCap = ceilDiv(feeCap, 100)
	feeCap.Add(feeCap, tip)
	least := new(big.Int).Add(baseFee, tip)
	if p.MaxFee != nil && feeCap.Cmp(p.MaxFee) > 0 {
		feeCap.Set(p.MaxFee)
		if least.Cmp(p.MaxFee) > 0 {
			return Fees{TipCap: minBig(tip, p.MaxFee), FeeCap: feeCap}, least, errFeesAboveCap
		}
	}
	return Fees{TipCap: tip, FeeCap: feeCap}, least, nil
}

// SuggestFees is the default policy's price, with minimum tip minTip, read the way a node without
// eth_feeHistory is: the latest block's base fee and the node's tip.
func SuggestFees(baseFee, tip, minTip *big.Int) Fees {
	f, _ := priceFees(facilitator.FeePolicy{}.WithDefaults(minTip, nil), feeReading{latestBaseFee: baseFee, nodeTip: tip})
	return f
}

// feeTTL bounds how stale a fee suggestion may be; base fees move once per block.
const feeTTL = 2 * time.Second

// feesRetryAfter is how soon a settlement refused for fees above the max fee may be tried again.
const feesRetryAfter = 15 * time.Second

// fees returns the current price under the network's fee policy, read at most once per feeTTL in
// one round trip: eth_feeHistory over the policy's blocks at its percentile, with the latest
// block's base fee and eth_maxPriorityFeePerGas for a node without it; eth_gasPrice on a legacy
// network. Fees the max fee cannot pay for come with an error wrapping errFeesAboveCap (and the
// fees at the limit, which a bump may still use); nothing may be signed for a new settlement then.
func (n *chainEngine) fees(ctx context.Context) (Fees, error) {
	n.feeMu.Lock()
	defer n.feeMu.Unlock()
	e := n.engine
	if !n.feeAt.IsZero() && e.now().Sub(n.feeAt) < feeTTL {
		return n.feeLast, n.feeErr
	}
	p := n.feePolicy
	r, err := readFees(ctx, n.chain, p, e.cfg.RPCTimeout)
	var (
		f     Fees
		least *big.Int
	)
	if err == nil {
		f, least, err = price(p, r)
	}
	if err != nil && !errors.Is(err, errFeesAboveCap) {
		return Fees{}, facilitator.Unavailable(facilitator.ReasonUnexpectedSettleError, "could not read the network's fees; nothing was sent, retry", err)
	}
	n.feeNeeded.Store(&neededFee{least: least, at: e.now()})
	if err != nil {
		// Units in the names: these are gwei, as --max-fee-gwei and fees.maxFeeGwei are given.
		e.log.Warn("network fees are above the configured max fee; new settlements are refused until they fall: raise the network's fees.maxFeeGwei (or --max-fee-gwei)",
			"network", n.net.ID, "max_fee_gwei", facilitator.Gwei(p.MaxFee), "needed_fee_cap_gwei", facilitator.Gwei(least),
			"fee_cap_gwei", facilitator.Gwei(f.FeeCap), "tip_gwei", facilitator.Gwei(f.TipCap))
		err = &facilitator.Error{Code: facilitator.EUnavailable, Reason: facilitator.ReasonFeesAboveCap,
			Message:    "the network's fees are above this facilitator's max fee per gas; nothing was sent, retry later",
			RetryAfter: feesRetryAfter, Err: err}
	}
	n.feeLast, n.feeErr, n.feeAt = f, err, e.now()
	return f, err
}

// readFees reads what pricing under p needs, in one round trip bounded by timeout:
// eth_feeHistory over the policy's blocks at its percentile, with the latest block's base fee and
// eth_maxPriorityFeePerGas for a node without it; eth_gasPrice on a legacy network.
func readFees(ctx context.Context, chain ethrpc.Chain, p facilitator.FeePolicy, timeout time.Duration) (feeReading, error) {
	var (
		r     feeReading
		batch []rpc.BatchElem
		head  struct {
			BaseFee *hexutil.Big `json:"baseFeePerGas"`
		}
		hist struct {
			BaseFees     []*hexutil.Big   `json:"baseFeePerGas"`
			GasUsedRatio []float64        `json:"gasUsedRatio"`
			Reward       [][]*hexutil.Big `json:"reward"`
		}
		tip, gasPrice hexutil.Big
	)
	if p.Legacy {
		batch = []rpc.BatchElem{ethrpc.GasPrice(&gasPrice)}
	} else {
		batch = []rpc.BatchElem{
			ethrpc.FeeHistory(uint64(p.HistoryBlocks), "latest", []float64{p.TipPercentile}, &hist),
			ethrpc.Block("latest", false, &head),
			ethrpc.MaxPriorityFeePerGas(&tip),
		}
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := chain.BatchCallContext(cctx, batch)
	if err == nil && p.Legacy {
		if err = batch[0].Error; err == nil {
			r.gasPrice = (*big.Int)(&gasPrice)
		}
	} else if err == nil {
		if batch[0].Error == nil && len(hist.BaseFees) == len(hist.GasUsedRatio)+1 && len(hist.Reward) == len(hist.GasUsedRatio) {
			h := &feeHistory{gasUsedRatio: hist.GasUsedRatio}
			for _, b := range hist.BaseFees {
				h.baseFees = append(h.baseFees, (*big.Int)(b))
			}
			for _, rw := range hist.Reward {
				var v *big.Int
				if len(rw) == 1 {
					v = (*big.Int)(rw[0])
				}
				h.rewards = append(h.rewards, v)
			}
			r.history = h
		}
		if batch[1].Error == nil && head.BaseFee != nil {
			r.latestBaseFee = (*big.Int)(head.BaseFee)
		}
		if batch[2].Error == nil {
			r.nodeTip = (*big.Int)(&tip)
		}
	}
	return r, err
}

// FeeQuote is one reading of a network's fees against its policy.
type FeeQuote struct {
	// Fees are what a new transaction would offer (at the max fee when Above).
	Fees Fees
	// Least is the least fee cap (or gas price) a transaction could be mined at now: the next
	// block's base fee plus the tip, or the node's gas price.
	Least *big.Int
	// Above: Least is above the policy's max fee, so every new settlement is refused
	// (network_fees_above_cap).
	Above bool
}

// QuoteFees reads the network's fees once through chain, as the engine does before it signs, and
// prices them under p (its defaults applied: facilitator.FeePolicy.WithDefaults): what
// --check-config compares the max fee with.
func QuoteFees(ctx context.Context, chain ethrpc.Chain, p facilitator.FeePolicy, timeout time.Duration) (FeeQuote, error) {
	r, err := readFees(ctx, chain, p, timeout)
	if err != nil {
		return FeeQuote{}, err
	}
	f, least, err := price(p, r)
	if err != nil && !errors.Is(err, errFeesAboveCap) {
		return FeeQuote{}, err
	}
	return FeeQuote{Fees: f, Least: least, Above: err != nil}, nil
}

// NetworkFees is a network's max fee and what its last fee reading asked of a new transaction.
type NetworkFees struct {
	Network string
	// MaxFee is the most a transaction offers per gas, in wei (nil: no limit).
	MaxFee *big.Int
	// Least is the least fee cap a transaction could be mined at by the last reading (nil:
	// none yet), and At when it was read.
	Least *big.Int
	At    time.Time
}

// Fees lists each network's max fee and last fee reading (read at scrape time).
func (e *Engine) Fees() []NetworkFees {
	ids := make([]string, 0, len(e.networks))
	for id := range e.networks {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]NetworkFees, 0, len(ids))
	for _, id := range ids {
		n := e.networks[id]
		nf := NetworkFees{Network: id, MaxFee: n.feePolicy.MaxFee}
		if r := n.feeNeeded.Load(); r != nil {
			nf.Least, nf.At = r.least, r.at
		}
		out = append(out, nf)
	}
	return out
}

// dueForBump reports whether t's newest variant is due to be replaced with higher fees: a node
// called it underpriced since the last round (o.underpriced, the flag wantBump raises), or a node
// took it and BumpAfter has passed since it was signed. The decisions (sendstate.go) then read the
// chain first, and bump on those reads (bumpOnReads).
func dueForBump(t track, o observation, p policy) bool {
	return o.underpriced || bumpTime(t, o.now, p)
}

func bumpTime(t track, now time.Time, p policy) bool {
	if len(t.variants) == 0 {
		return false
	}
	v := t.variants[len(t.variants)-1]
	return !v.sentAt.IsZero() && now.Sub(v.signedAt) >= p.bumpAfter
}

// bumpOnReads decides a bump that is due, on pinned reads (o.chain) that found the nonce unused. A
// bump replaces an unmined transaction, never a mined one: so never on reads behind a head the
// engine has seen, where the nonce may be mined (ok false, with a wait). And twice, like every
// step that rests on "not there": a node on a branch a reorganisation replaced has the block
// number too, with our nonce unused in it. Both reads are at the freshest head (the verdict pins
// no block), never at an older one.
func bumpOnReads(t track, o observation, why string) (d decision, ok bool) {
	c := o.chain
	if c.at < max(o.highest, c.nodeHead) {
		return decision{act: actWait, why: "bump due, but the reads are behind the highest head seen"}, false
	}
	return twice(t, decision{act: actBump, why: why}, 0, common.Hash{}), true
}

// unsentBump reports whether t's newest variant is a replacement no node was asked to take yet:
// its send waited (bumpVetoed after signing), or the process that signed it stopped first. Its
// first send is the bump's, so it rests on what a bump rests on: pinned reads at the highest head
// seen that found the nonce unused (sendBumpOnReads), never on a resend's timing alone (the
// simulator's seed 23543: a bump held back for a later head went out a round later on the
// resend timer, its nonce mined in that head by a foreign transaction).
func unsentBump(t track) bool {
	n := len(t.variants)
	return n > 1 && t.variants[n-1].sentAt.IsZero() && t.variants[n-1].tried.IsZero()
}

// sendBumpOnReads sends a bump not sent yet, on pinned reads that found the nonce unused, when
// they are at the highest head seen; behind it, it waits for fresher reads.
func sendBumpOnReads(o observation) decision {
	c := o.chain
	if c.at < max(o.highest, c.nodeHead) {
		return decision{act: actWait, why: "a bump not sent yet, on reads behind the highest head seen"}
	}
	return decision{act: actSend, why: "a bump not sent yet, on reads at the highest head seen"}
}

// bumpVetoed reports whether a bump decided on the reads o is to wait: a later head than the
// reads' was told of since (highest, by another step of the round), where the nonce may be mined.
// The next round reads again; meanwhile the current transaction is resent.
func bumpVetoed(o observation, highest uint64) bool {
	return o.chain != nil && highest > o.chain.at
}

// wantBump raises f's underpriced flag: a node refused its newest variant as underpriced. The
// watcher's next round takes it (takeBump) into the settlement's observation, where it makes a
// bump due at once (dueForBump), without waiting for BumpAfter.
func (n *chainEngine) wantBump(f *flight) {
	n.bumpMu.Lock()
	n.bumps[f.id] = true
	n.bumpMu.Unlock()
}

// takeBump lowers f's underpriced flag and reports whether it was raised.
func (n *chainEngine) takeBump(f *flight) bool {
	n.bumpMu.Lock()
	defer n.bumpMu.Unlock()
	if n.bumps[f.id] {
		delete(n.bumps, f.id)
		return true
	}
	return false
}

// carryBump carries out a bump the round decided for f on the reads o, unless they are vetoed
// (bumpVetoed): it signs the replacement (bump). Either way the caller resends f's newest
// variant (a failed bump leaves the current transaction out there).
func (n *chainEngine) carryBump(ctx context.Context, f *flight, t track, o observation) {
	if bumpVetoed(o, n.maxSeen.Load()) {
		return
	}
	if err := n.bump(ctx, f, t.variants[len(t.variants)-1].hash); err != nil {
		n.engine.log.Warn("fee bump failed; resending the current transaction", f.logAttrs("err", err)...)
	}
}

// BumpFees prices a replacement of old: each of tip and fee cap at least percent above the old
// one (the pool's replacement rule, rounded up, so that a pool that compares with
// old*(100+percent)/100 in integers takes it) and at least the current suggestion, with the fee
// cap never below the tip. A fee cap over limit (nil: none) is cut down to it; ok is false when
// the cut leaves no valid replacement (the current fees stay).
func BumpFees(old, suggested Fees, percent uint64, limit *big.Int) (f Fees, ok bool) {
	minTip, minCap := plusPercent(old.TipCap, percent), plusPercent(old.FeeCap, percent)
	tip := maxBig(minTip, suggested.TipCap)
	feeCap := maxBig(minCap, suggested.FeeCap)
	if feeCap.Cmp(tip) < 0 {
		feeCap = new(big.Int).Set(tip)
	}
	if limit != nil && feeCap.Cmp(limit) > 0 {
		feeCap = new(big.Int).Set(limit)
		if tip.Cmp(feeCap) > 0 {
			tip = new(big.Int).Set(feeCap)
		}
		if feeCap.Cmp(minCap) < 0 || tip.Cmp(minTip) < 0 {
			return Fees{}, false
		}
	}
	return Fees{TipCap: tip, FeeCap: feeCap}, true
}

// plusPercent is ceil(n * (100+p) / 100), and at least n+1: a replacement must differ.
func plusPercent(n *big.Int, p uint64) *big.Int {
	out := ceilDiv(new(big.Int).Mul(n, new(big.Int).SetUint64(100+p)), 100)
	if out.Cmp(n) <= 0 {
		out.Add(n, big.NewInt(1))
	}
	return out
}

// bump signs a replacement with the same nonce and higher fees, and commits it before it is sent.
// basedOn is the variant the decision saw as the newest: the bump is a compare-and-swap on it,
// so a batch, whose members each decide the bump in the same round, is replaced once (the first
// member's bump gives every member the new variant; the others find basedOn replaced).
func (n *chainEngine) bump(ctx context.Context, f *flight, basedOn common.Hash) error {
	e := n.engine
	if fam := f.family; fam != nil {
		fam.mu.Lock()
		defer fam.mu.Unlock()
	}
	if f.latest().hash != basedOn {
		return nil // replaced since the decision
	}
	suggested, err := n.fees(ctx)
	if err != nil && !errors.Is(err, errFeesAboveCap) {
		return err
	}
	// Above the max fee, the suggestion is at the limit: the replacement goes as far as it allows.
	old := f.latest()
	fees, ok := BumpFees(old.fees, suggested, n.feePolicy.BumpPercent, n.feePolicy.MaxFee)
	if !ok {
		e.log.Warn("fee bump would exceed the max fee; keeping the current fees", f.logAttrs("tx", old.hash, "fee_cap_gwei", facilitator.Gwei(old.fees.FeeCap), "max_fee_gwei", facilitator.Gwei(n.feePolicy.MaxFee))...)
		return nil
	}
	s := f.sender
	l := s.held()
	if l == nil || f.isDropped() {
		return errNotLeased // the key's holder bumps it
	}
	// A signer that fails leaves the current transaction out there, resent as it is; the bump is
	// decided again next round.
	st, err := s.sign(ctx, f.txNonce(), f.target(), f.data, f.gas, fees)
	if err != nil {
		return err
	}
	tx, raw := st.tx, st.raw
	// Through the lease: a process that lost the key cannot add a variant its next holder would
	// not know of.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseWriteTimeout)
	err = l.AddTx(wctx, f.id, facilitator.TxRecord{Hash: tx.Hash(), Raw: raw, TipCap: fees.TipCap, FeeCap: fees.FeeCap, Gas: f.gas})
	cancel()
	if errors.Is(err, facilitator.ErrDuplicate) {
		// Recorded by an earlier bump whose answer was lost (the same fees sign the same bytes).
		err = nil
	}
	if errors.Is(err, facilitator.ErrNotFound) {
		// No longer open in the ledger (someone else resolved it): nothing to replace.
		n.sync(ctx, f)
		return err
	}
	members := []*flight{f}
	if f.family != nil {
		members = f.family.members
	}
	if err != nil {
		// The write may have committed: the ledger then holds these bytes, and another process
		// (the reconcile job's resend) may send them. Never sent from here, but ours if they land
		// (the simulator's seed 2549: taken for another's transaction, a payment we made was
		// answered "used by a transaction that is not ours").
		for _, m := range members {
			m.update(func(m *flight) { m.unsure = append(m.unsure, tx.Hash()) })
		}
		return err
	}
	now := e.now()
	for _, m := range members {
		m.update(func(m *flight) {
			m.txs = append(m.txs, &sentTx{hash: tx.Hash(), nonce: m.nonce, raw: raw, fees: fees, signedAt: now})
		})
	}
	e.log.Info("fee bump", f.logAttrs("tx_nonce", f.txNonce(), "tx", tx.Hash(), "replaces", old.hash, "tip_gwei", facilitator.Gwei(fees.TipCap), "fee_cap_gwei", facilitator.Gwei(fees.FeeCap))...)
	e.cfg.Observer.FeeBumped(n.net.ID)
	return nil
}

func ceilDiv(n *big.Int, d int64) *big.Int {
	out := new(big.Int).Add(n, big.NewInt(d-1))
	return out.Div(out, big.NewInt(d))
}

// median is the middle value (the lower of the two middles), or nil for none.
func median(vs []*big.Int) *big.Int {
	if len(vs) == 0 {
		return nil
	}
	s := slices.Clone(vs)
	slices.SortFunc(s, func(a, b *big.Int) int { return a.Cmp(b) })
	return new(big.Int).Set(s[(len(s)-1)/2])
}

func clampTip(tip, lo, hi *big.Int) *big.Int {
	switch {
	case lo != nil && tip.Cmp(lo) < 0:
		return new(big.Int).Set(lo)
	case hi != nil && tip.Cmp(hi) > 0:
		return new(big.Int).Set(hi)
	}
	return new(big.Int).Set(tip)
}

func maxBig(a, b *big.Int) *big.Int {
	if a.Cmp(b) >= 0 {
		return new(big.Int).Set(a)
	}
	return new(big.Int).Set(b)
}

func minBig(a, b *big.Int) *big.Int {
	if a.Cmp(b) <= 0 {
		return new(big.Int).Set(a)
	}
	return new(big.Int).Set(b)
}
