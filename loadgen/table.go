package loadgen

import (
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Render prints the report as the table `facilitator-dev bench` shows. Ratios put the better side's
// advantage above 1 when ours is better: ours/official for rates, official/ours for latencies.
func Render(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "x402 facilitator load benchmark, %s\n", r.Started.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "machine:     %s\n", r.Machine)
	fmt.Fprintf(&b, "facilitator: %s   chain: %s (chain id %d, head %d at start)\n", r.FacilitatorURL, r.RPCURL, r.Token.ChainID, r.HeadAtStart)
	fmt.Fprintf(&b, "token:       %s (%q version %q); payments of %d atomic units, each to a fresh payee\n\n",
		r.Token.Address.Hex(), r.Token.Name, r.Token.Version, paymentValue)

	var t table
	ref := r.Ref.Verify != nil || r.Ref.Settle != nil
	refCol := func(s string) string {
		if !ref {
			return "not run"
		}
		return s
	}
	row := t.add
	row("", "ours", "official (reference)", "ratio")
	if v := r.Ours.Verify; v != nil {
		rv := r.Ref.Verify
		took := v.Elapsed.Round(100 * time.Millisecond).String()
		if rv != nil {
			// A phase ends when its payments are used up, so the two sides' lengths can differ.
			took = fmt.Sprintf("ours %s, official %s", took, rv.Elapsed.Round(100*time.Millisecond))
		}
		row(fmt.Sprintf("/verify, %s, %s", verifyLoad(v), took))
		row("  valid verdicts/s", fmtRate(v.Rate()), refCol(optRate(rv, func(x *VerifyResult) float64 { return x.Rate() })),
			rateRatio(v.Rate(), rv, func(x *VerifyResult) float64 { return x.Rate() }))
		for _, q := range []float64{0.50, 0.99} {
			row(fmt.Sprintf("  latency p%.0f", q*100), fmtDur(v.Latencies.Percentile(q)),
				refCol(optDur(rv, func(x *VerifyResult) time.Duration { return x.Latencies.Percentile(q) })),
				latRatio(v.Latencies.Percentile(q), rv, func(x *VerifyResult) time.Duration { return x.Latencies.Percentile(q) }))
		}
		row("  failed (error or not valid)", fmt.Sprint(v.Failed), refCol(optInt(rv, func(x *VerifyResult) int { return x.Failed })), "")
	}
	verifyLevelRows(row, r, refCol)
	if s := r.Ours.Settle; s != nil {
		rs := r.Ref.Settle
		row(fmt.Sprintf("/settle, concurrency %d, until all confirmed", s.Concurrency))
		row("  payments (K)", fmt.Sprint(s.K), refCol(optInt(rs, func(x *SettleResult) int { return x.K })), "")
		row("  signer keys", fmt.Sprint(s.Signers), refCol(optInt(rs, func(x *SettleResult) int { return x.Signers })), "")
		row("  settlements/s", fmtRate(s.Rate()), refCol(optRate(rs, func(x *SettleResult) float64 { return x.Rate() })),
			rateRatio(s.Rate(), rs, func(x *SettleResult) float64 { return x.Rate() }))
		for _, q := range []float64{0.50, 0.99} {
			row(fmt.Sprintf("  latency to confirmed p%.0f", q*100), fmtDur(s.Latencies.Percentile(q)),
				refCol(optDur(rs, func(x *SettleResult) time.Duration { return x.Latencies.Percentile(q) })),
				latRatio(s.Latencies.Percentile(q), rs, func(x *SettleResult) time.Duration { return x.Latencies.Percentile(q) }))
		}
		row("  confirmed / followed pending", fmt.Sprintf("%d / %d", s.Confirmed, s.Followed),
			refCol(optStr(rs, func(x *SettleResult) string { return fmt.Sprintf("%d / %d", x.Confirmed, x.Followed) })), "")
		row("  on-chain transfers (of K)", fmt.Sprintf("%d / %d", s.Chain.Transfers, s.K),
			refCol(optStr(rs, func(x *SettleResult) string { return fmt.Sprintf("%d / %d", x.Chain.Transfers, x.K) })), "")
		row("  duplicates", fmt.Sprint(s.Chain.Duplicates), refCol(optInt(rs, func(x *SettleResult) int { return x.Chain.Duplicates })), "")
		row("  nonce errors (answers)", fmt.Sprint(s.NonceErrors), refCol(optInt(rs, func(x *SettleResult) int { return x.NonceErrors })), "")
		row("  other failed answers", fmt.Sprint(s.Failed-s.NonceErrors), refCol(optInt(rs, func(x *SettleResult) int { return x.Failed - x.NonceErrors })), "")
		row("  signer txs mined / reverted", fmt.Sprintf("%d / %d", s.Chain.SenderTxs, s.Chain.SenderReverted),
			refCol(optStr(rs, func(x *SettleResult) string { return fmt.Sprintf("%d / %d", x.Chain.SenderTxs, x.Chain.SenderReverted) })), "")
		row("  blocks", fmt.Sprint(s.Chain.Blocks), refCol(optInt(rs, func(x *SettleResult) int { return int(x.Chain.Blocks) })), "")
	}
	if l := r.Ours.Lookup; l != nil {
		row(fmt.Sprintf("status lookups (GET /v1/authorizations/…), concurrency %d, %s", l.Concurrency, l.Elapsed.Round(100*time.Millisecond)))
		row("  answered/s", fmtRate(l.Rate()), refCol("n/a (no status API)"), "")
		row("  latency p50", fmtDur(l.Latencies.Percentile(0.50)), refCol("n/a"), "")
		row("  latency p99", fmtDur(l.Latencies.Percentile(0.99)), refCol("n/a"), "")
		row("  failed", fmt.Sprint(l.Failed), "", "")
	}
	if h := r.Ours.Webhook; h != nil {
		row(fmt.Sprintf("webhook dispatch: %d payments settled with one webhook registered (a loopback receiver here), until every event is delivered", h.K))
		row("  events delivered / expected", fmt.Sprintf("%d / %d", h.Delivered, h.Expected), refCol("n/a (no webhooks)"),
			fmt.Sprintf("(%d confirmed payments x %d types)", h.Confirmed, len(hookStates)))
		row("  missing / duplicate deliveries / bad signatures", fmt.Sprintf("%d / %d / %d", h.Missing, h.Duplicates, h.BadSignature), "", "")
		row("  event to delivery p50", fmtDur(h.Latencies.Percentile(0.50)), "", "")
		row("  event to delivery p99", fmtDur(h.Latencies.Percentile(0.99)), "", "")
		row("  first /settle to last delivery", fmtDur(h.Elapsed), "", fmt.Sprintf("(%d earlier events also delivered, %d evm_mine nudges)", h.Others, h.Nudges))
	}
	cpuRows(row, r, refCol)
	if rp := r.Replay; rp != nil {
		row(fmt.Sprintf("payment-identifier replay of a settled payload, %d sequential", rp.N))
		row("  latency p50", fmtDur(rp.Latencies.Percentile(0.50)), refCol("n/a (no payment-identifier)"), "")
		row("  latency p99", fmtDur(rp.Latencies.Percentile(0.99)), refCol("n/a"), "")
		row("  answered as replays", fmt.Sprintf("%d / %d", rp.Replayed, rp.N), "", "")
	}
	if len(r.Ceiling) > 0 {
		best := 0.0
		for _, c := range r.Ceiling {
			best = max(best, c.Rate())
		}
		row("chain ceiling: pre-signed transferWithAuthorization txs, one sender, until mined")
		for _, c := range r.Ceiling {
			row(fmt.Sprintf("  %s (%d txs)", c.Mode, c.N), fmtRate(c.Rate()), "", fmt.Sprintf("(%d blocks, %d reverted, %d evm_mine nudges)", c.Chain.Blocks, c.Chain.SenderReverted, c.Nudges))
		}
		if s := r.Ours.Settle; s != nil && best > 0 {
			refPct := "not run"
			if rs := r.Ref.Settle; rs != nil {
				refPct = fmt.Sprintf("%.1f%%", 100*rs.Rate()/best)
			}
			row("  settle rate as % of the ceiling", fmt.Sprintf("%.1f%%", 100*s.Rate()/best), refPct, "")
		}
	}
	if bf := r.Backfill; bf != nil {
		e := bf.Emitted
		row("indexer backfill into Postgres: Emitter events from its deploy block to the head (" + bf.Network + ")")
		row("  events/s", fmtRate(bf.Rate()), "", "")
		row("  events stored / emitted", fmt.Sprintf("%d / %d", bf.Stored, e.Events), "", fmt.Sprintf("(%d emitMany transactions)", e.Calls))
		row("  blocks read", fmt.Sprint(bf.Blocks()), "", fmt.Sprintf("(%d..%d)", e.DeployBlock, e.Head))
		row("  time", fmtDur(bf.Elapsed), "", "")
	} else if r.IndexNote != "" {
		row("indexer backfill events/s: " + r.IndexNote)
	}
	if r.Ours.Memory != nil || r.Ref.Memory != nil {
		row("peak RSS of each facilitator process (VmRSS sampled every 100 ms during its phases; VmHWM since it started)")
		row("  peak VmRSS", fmtMem(r.Ours.Memory, func(m *Memory) uint64 { return m.Peak }), refCol(fmtMem(r.Ref.Memory, func(m *Memory) uint64 { return m.Peak })), "")
		row("  VmHWM", fmtMem(r.Ours.Memory, func(m *Memory) uint64 { return m.HWM }), refCol(fmtMem(r.Ref.Memory, func(m *Memory) uint64 { return m.HWM })), "")
	}
	t.write(&b)
	notes := append([]string{}, r.Notes...)
	if rs, os := r.Ref.Settle, r.Ours.Settle; rs != nil && os != nil && rs.K != os.K {
		notes = append(notes, fmt.Sprintf("the reference settled K=%d payments (ours %d) at the same concurrency: it is slower, and a smaller K keeps the run short", rs.K, os.K))
	}
	if ref {
		notes = append(notes, "ratios: ours/official for rates, official/ours for latencies (above 1: ours is better)")
	}
	for _, s := range []*Side{&r.Ours, &r.Ref} {
		if s.Verify != nil && s.Verify.FirstFailed != "" {
			notes = append(notes, fmt.Sprintf("%s /verify first failure: %s", s.Name, s.Verify.FirstFailed))
		}
		if s.Lookup != nil && s.Lookup.FirstFailed != "" {
			notes = append(notes, fmt.Sprintf("%s status lookups first failure: %s", s.Name, s.Lookup.FirstFailed))
		}
		if s.Settle != nil && s.Settle.FirstFailed != "" {
			notes = append(notes, fmt.Sprintf("%s /settle first failure: %s", s.Name, s.Settle.FirstFailed))
		}
		if s.Memory != nil && s.Memory.Err != "" {
			notes = append(notes, fmt.Sprintf("%s memory: %s", s.Name, s.Memory.Err))
		}
	}
	if h := r.Ours.Webhook; h != nil && h.FirstFailed != "" {
		notes = append(notes, "webhook phase first failure: "+h.FirstFailed)
	}
	if r.Replay != nil && r.Replay.FirstFailed != "" {
		notes = append(notes, "replay first failure: "+r.Replay.FirstFailed)
	}
	notes = append(notes, cpuNotes(r)...)
	for _, n := range notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func fmtRate(f float64) string { return fmt.Sprintf("%.1f/s", f) }

// fmtDur prints milliseconds with three significant digits or so: µs-level replays and
// second-level settles fit the same column.
func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f ms", ms)
	default:
		return fmt.Sprintf("%.0f ms", ms)
	}
}

func fmtMem(m *Memory, f func(*Memory) uint64) string {
	if m == nil || m.Samples == 0 {
		return "not sampled"
	}
	return fmt.Sprintf("%.1f MiB (pid %d)", float64(f(m))/(1<<20), m.PID)
}

func optRate[T any](x *T, f func(*T) float64) string {
	if x == nil {
		return "—"
	}
	return fmtRate(f(x))
}

func optDur[T any](x *T, f func(*T) time.Duration) string {
	if x == nil {
		return "—"
	}
	return fmtDur(f(x))
}

func optInt[T any](x *T, f func(*T) int) string {
	if x == nil {
		return "—"
	}
	return fmt.Sprint(f(x))
}

func optStr[T any](x *T, f func(*T) string) string {
	if x == nil {
		return "—"
	}
	return f(x)
}

// rateRatio is ours/theirs; latRatio is theirs/ours. Both are "—" without a reference figure or
// with a zero denominator.
func rateRatio[T any](ours float64, x *T, f func(*T) float64) string {
	if x == nil || f(x) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2fx", ours/f(x))
}

func latRatio[T any](ours time.Duration, x *T, f func(*T) time.Duration) string {
	if x == nil || ours == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2fx", float64(f(x))/float64(ours))
}

// table aligns its rows' cells in columns; a row of one cell is a section heading, printed as is
// and left out of the column widths.
type table struct{ rows [][]string }

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(b *strings.Builder) {
	var widths []int
	for _, r := range t.rows {
		if len(r) < 2 {
			continue
		}
		for i, c := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range t.rows {
		var line strings.Builder
		for i, c := range r {
			line.WriteString(c)
			if i < len(r)-1 && len(r) > 1 {
				line.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)+2))
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
}

// verifyLoad says how a /verify phase sent its requests.
func verifyLoad(v *VerifyResult) string {
	if v.Offered > 0 {
		return fmt.Sprintf("%s/s offered (at most %d outstanding)", strconvRate(v.Offered), v.Concurrency)
	}
	return fmt.Sprintf("concurrency %d", v.Concurrency)
}

// strconvRate prints an offered rate without a needless fraction: 50, 12.5.
func strconvRate(f float64) string { return strings.TrimSuffix(fmt.Sprintf("%.1f", f), ".0") }

// verifyLevelRows prints, for each arrival rate of the /verify phase, what was answered and the
// CPU per valid verdict: the facilitator's own, and the server side's (facilitator, chain node and
// Postgres: the load generator is the clients' cost). Levels are matched by position: both sides
// run the same rates in the same order.
func verifyLevelRows(row func(...string), r *Report, refCol func(string) string) {
	if len(r.Ours.VerifyLevels) == 0 {
		return
	}
	heading := "/verify by arrival rate: distinct payments, each verified once; CPU ms per valid /verify"
	if len(r.Ref.VerifyLevels) > 0 {
		heading += " (ratio ours/official, below 1: ours costs less)"
	}
	row(heading)
	server := []string{RoleFacilitator, RoleNode, RolePostgres}
	if idle := r.Ours.IdleCPU; idle != nil {
		row(fmt.Sprintf("  idle, %s with no request before the first rate: CPU ms per second", idle.Elapsed.Round(100*time.Millisecond)))
		for _, c := range []struct {
			name  string
			roles []string
		}{{"facilitator", server[:1]}, {"facilitator + chain node + Postgres", server}} {
			ours, theirs := "—", "—"
			if ms, ok := sumMsPerSecond(idle, c.roles); ok {
				ours = fmtMs(ms)
			}
			if ms, ok := sumMsPerSecond(r.Ref.IdleCPU, c.roles); ok {
				theirs = fmtMs(ms)
			}
			row("    "+c.name, ours, refCol(theirs), "")
		}
	}
	for i, lv := range r.Ours.VerifyLevels {
		var ref *VerifyLevel
		if i < len(r.Ref.VerifyLevels) {
			ref = &r.Ref.VerifyLevels[i]
		}
		v := lv.Result
		refResult := func(f func(*VerifyResult) string) string {
			if ref == nil {
				return refCol("—")
			}
			return refCol(f(&ref.Result))
		}
		row(fmt.Sprintf("  %s, %s: valid verdicts/s", verifyLoad(&v), v.Elapsed.Round(100*time.Millisecond)), fmtRate(v.Rate()),
			refResult(func(x *VerifyResult) string { return fmtRate(x.Rate()) }), "")
		lat := func(x *VerifyResult) string {
			return fmtDur(x.Latencies.Percentile(0.50)) + ", " + fmtDur(x.Latencies.Percentile(0.99))
		}
		row("    latency p50, p99", lat(&v), refResult(lat), "")
		sent := func(x *VerifyResult) string { return fmt.Sprintf("%d / %d, %d", x.Sent, x.Payments, x.Failed) }
		row("    payments sent / signed, failed", sent(&v), refResult(sent), "")
		var refCPU *CPUPhase
		if ref != nil {
			refCPU = ref.CPU
		}
		for _, c := range []struct {
			name  string
			roles []string
		}{{"facilitator CPU", server[:1]}, {"facilitator + chain node + Postgres CPU", server}} {
			o, ook := sumMsPerOp(lv.CPU, c.roles)
			f, fok := sumMsPerOp(refCPU, c.roles)
			ours, theirs, ratio := "—", "—", ""
			if ook {
				ours = fmtMs(o)
			}
			if fok {
				theirs = fmtMs(f)
			}
			if ook && fok && f > 0 {
				ratio = fmt.Sprintf("%.3fx", o/f)
			}
			row("    "+c.name, ours, refCol(theirs), ratio)
		}
	}
}

// sumMsPerOp is the CPU milliseconds per operation of the roles that were measured; ok is false
// when none was.
func sumMsPerOp(p *CPUPhase, roles []string) (float64, bool) { return sumRoles(p.MsPerOp, roles) }

// sumMsPerSecond is sumMsPerOp per second of the phase.
func sumMsPerSecond(p *CPUPhase, roles []string) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return sumRoles(p.MsPerSecond, roles)
}

func sumRoles(f func(role string) (float64, bool), roles []string) (sum float64, ok bool) {
	for _, role := range roles {
		if ms, mok := f(role); mok {
			sum, ok = sum+ms, true
		}
	}
	return sum, ok
}

// cpuRoles are the processes the CPU rows name, in order.
var cpuRoles = []string{RoleFacilitator, RoleNode, RolePostgres, RoleLoadgen}

// cpuRows prints the CPU each process spent per operation, and the gas per settlement. The ratio
// is ours/official: below 1, ours costs less.
func cpuRows(row func(...string), r *Report, refCol func(string) string) {
	phases := []struct {
		name      string
		ours, ref *CPUPhase
		// none is what the reference's column says when it has no such operation.
		none string
	}{
		{"per valid /verify", r.Ours.VerifyCPU, r.Ref.VerifyCPU, ""},
		{"per confirmed settlement", r.Ours.SettleCPU, r.Ref.SettleCPU, ""},
		{"per status lookup", r.Ours.LookupCPU, nil, "n/a (no status API)"},
	}
	if phases[0].ours == nil && phases[1].ours == nil {
		return
	}
	if v := r.Ours.Verify; v != nil {
		// The headline /verify is the last arrival rate's; the others are in their own rows.
		phases[0].name += ", " + verifyLoad(v)
	}
	row("CPU ms per operation (utime+stime from /proc/<pid>/stat over the phase / its operations; ratio ours/official, below 1: ours costs less)")
	for _, ph := range phases {
		if ph.ours == nil {
			continue
		}
		row(fmt.Sprintf("  %s (%d ops; official %s)", ph.name, ph.ours.Ops, refCol(optInt(ph.ref, func(p *CPUPhase) int { return p.Ops }))))
		var sumOurs, sumRef float64
		for _, role := range cpuRoles {
			o, ook := ph.ours.MsPerOp(role)
			f, fok := ph.ref.MsPerOp(role)
			sumOurs += o
			sumRef += f
			ratio := ""
			if ook && fok && f > 0 {
				ratio = fmt.Sprintf("%.3fx", o/f)
			}
			refCell := cpuCell(ph.ref, role, f, fok)
			if ph.none != "" {
				refCell = ph.none
			}
			row("    "+role, cpuCell(ph.ours, role, o, ook), refCol(refCell), ratio)
		}
		ratio := ""
		if sumRef > 0 {
			ratio = fmt.Sprintf("%.3fx", sumOurs/sumRef)
		}
		row("    sum of the measured", fmtMs(sumOurs), refCol(optStr(ph.ref, func(*CPUPhase) string { return fmtMs(sumRef) })), ratio)
	}
	hookCPURows(row, r)
	if s := r.Ours.Settle; s != nil {
		rs := r.Ref.Settle
		ratio := ""
		if rs != nil && rs.Chain.GasPerTransfer() > 0 {
			ratio = fmt.Sprintf("%.3fx", s.Chain.GasPerTransfer()/rs.Chain.GasPerTransfer())
		}
		row("  gas per settlement (signer txs' gasUsed / on-chain transfers)", fmt.Sprintf("%.0f", s.Chain.GasPerTransfer()),
			refCol(optStr(rs, func(x *SettleResult) string { return fmt.Sprintf("%.0f", x.Chain.GasPerTransfer()) })), ratio)
	}
}

// cpuCell is a role's figure, or why there is none.
func cpuCell(p *CPUPhase, role string, ms float64, ok bool) string {
	if p == nil {
		return "—"
	}
	if ok {
		return fmtMs(ms)
	}
	if rc := p.Role(role); rc != nil && rc.Err != "" {
		return rc.Err
	}
	return "—"
}

// fmtMs prints CPU milliseconds per operation: fractions of a millisecond to three decimals.
func fmtMs(ms float64) string {
	if ms < 10 {
		return fmt.Sprintf("%.3f ms", ms)
	}
	return fmt.Sprintf("%.1f ms", ms)
}

// cpuNotes say which chain each side ran on and how the Postgres backends were counted.
func cpuNotes(r *Report) []string {
	var out []string
	if r.Ours.VerifyCPU == nil {
		return nil
	}
	chains := fmt.Sprintf("each side on a fresh anvil of its own: ours %s (head %d at start)", r.Ours.Chain, r.Ours.HeadAtStart)
	if r.Ref.Chain != "" {
		chains += fmt.Sprintf(", official %s (head %d at start)", r.Ref.Chain, r.Ref.HeadAtStart)
	}
	out = append(out, chains)
	for _, ph := range []struct {
		name string
		p    *CPUPhase
	}{{"/verify", r.Ours.VerifyCPU}, {"/settle", r.Ours.SettleCPU}} {
		if pg := ph.p.Role(RolePostgres); pg != nil && pg.Err == "" {
			out = append(out, fmt.Sprintf("Postgres during our %s: %d backends of our database counted, %d opened and %d closed during the phase (sampled every %s)",
				ph.name, pg.PIDs, pg.Came, pg.Went, cpuEvery))
		}
	}
	return out
}

// hookCPURows prints the webhook phase's CPU per delivered event: over the whole phase (its
// settlements included), and beyond its settlements at the settle phase's rate, which is the
// dispatch's own cost.
func hookCPURows(row func(...string), r *Report) {
	ph, h := r.Ours.WebhookCPU, r.Ours.Webhook
	if ph == nil || h == nil {
		return
	}
	row(fmt.Sprintf("  per delivered webhook event (%d ops): the whole phase / beyond its %d settlements at the settle phase's rate", ph.Ops, h.Confirmed))
	var sumAll, sumExtra float64
	for _, role := range cpuRoles {
		all, ok := ph.MsPerOp(role)
		extra, eok := extraMsPerOp(ph, r.Ours.SettleCPU, h.Confirmed, role)
		sumAll += all
		sumExtra += extra
		extraCell := "—"
		if eok {
			extraCell = fmtMs(extra)
		}
		row("    "+role, cpuCell(ph, role, all, ok), extraCell, "")
	}
	row("    sum of the measured", fmtMs(sumAll), fmtMs(sumExtra), "")
}
