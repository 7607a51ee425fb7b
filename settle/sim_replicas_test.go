package settle_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/settle"
	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
)

// Several replicas: in a third of the worlds (not the plain ones) two or three engines run over
// the same ledger and chain, each behind a load balancer of its own, leasing the signer keys
// through the simulated Leaser (settlesim.Leaser: Postgres's advisory locks). The merchants'
// /settle calls go to a replica drawn per call, and now and then the same call goes to a second
// one at once. A replica crashes now and then (its sessions end: its leases are lost and its
// memory is gone; nothing of it runs again) and comes back as a new engine over the same ledger
// (Start: the keys nobody holds, and their recovery); a lease's session is cut under a live
// replica, which learns it at its next step while another may already have taken the key over.
// Everything is drawn from a stream of its own, so that the main stream's schedule is the same
// with replicas or without.

// simReplicas is the replicas' side of a world.
type simReplicas struct {
	r      *rand.Rand
	on     bool
	leaser *settlesim.Leaser
	all    []*simReplica // in a fixed order: the first is the world's engine's slot
	// names counts the processes started, for their names.
	names int
	// sends are the transactions of ours sent, per key and nonce, in order, with who sent them.
	sends      map[spyKey][]simSend
	violations []string
	network    string

	crashes, restarts, cuts, seconds int
	// midCall counts the crashes at a fault point, in the middle of the engine's work.
	midCall int
}

// simReplica is one replica's slot: its engine (nil while it is down) and its chain.
type simReplica struct {
	name   string // the process's name, renewed at each restart
	engine *settle.Engine
	proc   *settlesim.Process
	spy    *sendSpy
	chain  ethrpc.Chain
	nodes  []*settlesim.Backend // its own nodes (none for the first: the world's)
	// dieAt is the fault point at which the process dies the next time it passes it ("": none).
	dieAt settle.FaultPoint
}

// simCrash is what a replica's Fault panics with to die at a fault point: it unwinds the call on
// the simulator's goroutine (Settle, ConfirmDelivery, Step) out of the engine, whose state is
// never touched again (guard buries the replica).
type simCrash struct{ at settle.FaultPoint }

// simSend is one transaction of ours sent to the chain by a replica (the first time it sent it).
type simSend struct {
	replica string
	hash    common.Hash
}

// setUpReplicas decides whether the world runs several replicas, and builds them.
func (w *simWorld) setUpReplicas() {
	rs := &w.replicas
	rs.r = rand.New(rand.NewPCG(w.seed, 0x4e91))
	if rs.r.IntN(3) != 0 {
		return
	}
	rs.on = true
	rs.sends = map[spyKey][]simSend{}
	rs.network = w.network.ID
	rs.leaser = settlesim.NewLeaser(w.ledger, w.clock)
	n := 2 + rs.r.IntN(2)
	first := &simReplica{spy: w.spy, chain: w.config.Networks[0].Chain}
	rs.all = append(rs.all, first)
	for i := 1; i < n; i++ {
		rp := &simReplica{}
		for j := range 1 + rs.r.IntN(2) {
			rp.nodes = append(rp.nodes, settlesim.NewBackend(w.chain, fmt.Sprintf("r%d-node%d", i, j), settlesim.Profile{}, rs.r))
		}
		rp.spy = &sendSpy{Chain: settlesim.NewBalancer(rs.r, rp.nodes...), w: w, variants: w.spy.variants}
		rp.chain = rp.spy
		rs.all = append(rs.all, rp)
	}
	for _, rp := range rs.all {
		w.boot(rp)
	}
	w.engine = first.engine
}

// boot makes a new process in rp's slot: a new engine with a session of its own, not started.
func (w *simWorld) boot(rp *simReplica) {
	rs := &w.replicas
	rs.names++
	rp.name = fmt.Sprintf("p%d", rs.names)
	rp.proc = rs.leaser.Process(rp.name)
	rp.spy.replica = rp.name + " "
	rp.spy.maxHead = 0 // a new process: nobody told it of any head yet
	cfg := w.config
	cfg.Networks = slices.Clone(cfg.Networks)
	cfg.Networks[0].Chain = rp.chain
	cfg.Leaser = rp.proc
	cfg.Logger = cfg.Logger.With("replica", rp.name)
	rp.dieAt = ""
	cfg.Fault = func(p settle.FaultPoint) {
		if rp.dieAt == p {
			panic(simCrash{p})
		}
	}
	rp.engine = w.newEngine(cfg)
}

func (w *simWorld) newEngine(cfg settle.Config) *settle.Engine {
	e, err := settle.NewStepped(cfg)
	if err != nil {
		panic(err)
	}
	return e
}

// engines are the engines running now, in the replicas' order.
func (w *simWorld) engines() []*settle.Engine {
	if !w.replicas.on {
		return []*settle.Engine{w.engine}
	}
	var out []*settle.Engine
	for _, rp := range w.replicas.all {
		if rp.engine != nil {
			out = append(out, rp.engine)
		}
	}
	return out
}

// spies are every replica's send spy.
func (w *simWorld) spies() []*sendSpy {
	if !w.replicas.on {
		return []*sendSpy{w.spy}
	}
	var out []*sendSpy
	for _, rp := range w.replicas.all {
		out = append(out, rp.spy)
	}
	return out
}

func (w *simWorld) startEngines() error {
	if !w.replicas.on {
		return w.engine.Start(w.ctx)
	}
	// In an order drawn: the first to start takes every key.
	for _, i := range w.replicas.r.Perm(len(w.replicas.all)) {
		if err := w.replicas.all[i].engine.Start(w.ctx); err != nil {
			return err
		}
	}
	return nil
}

func (w *simWorld) stopEngines() {
	for _, e := range w.engines() {
		_ = e.Stop(context.Background())
	}
}

// stepEngines is one step of every engine running, in an order drawn in a world of replicas.
func (w *simWorld) stepEngines() {
	if !w.replicas.on {
		w.engine.Step(w.ctx)
		return
	}
	for _, i := range w.replicas.r.Perm(len(w.replicas.all)) {
		if e := w.replicas.all[i].engine; e != nil {
			w.guard(e, func() { e.Step(w.ctx) })
		}
	}
}

// guard runs f, a call into e, and buries e's replica if it died at a fault point meanwhile.
func (w *simWorld) guard(e *settle.Engine, f func()) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		c, ok := r.(simCrash)
		if !ok {
			panic(r)
		}
		w.replicas.midCall++
		fmt.Fprintf(&w.log, "sim: a replica died at %s\n", c.at)
		w.died(e)
	}()
	f()
}

// pickEngines is the replica a /settle call goes to, and now and then a second one the same call
// goes to at once (nil: none).
func (w *simWorld) pickEngines() (first, second *settle.Engine) {
	if !w.replicas.on {
		return w.engine, nil
	}
	rs := &w.replicas
	up := w.engines()
	if len(up) == 0 {
		// Every replica is down: the merchant's call fails; the one it reaches first after a
		// restart answers. Modelled as a restart on demand, so that the call is not lost.
		w.restart(rs.all[rs.r.IntN(len(rs.all))])
		if up = w.engines(); len(up) == 0 {
			return nil, nil
		}
	}
	i := rs.r.IntN(len(up))
	first = up[i]
	if len(up) > 1 && rs.r.IntN(4) == 0 {
		second = up[(i+1+rs.r.IntN(len(up)-1))%len(up)]
	}
	return first, second
}

// replicaFaults gives the replicas' own nodes their faults (the world's nodes have theirs).
func (w *simWorld) replicaFaults() {
	for _, rp := range w.replicas.all {
		for _, b := range rp.nodes {
			b.SetProfile(settlesim.RandomProfile(w.replicas.r))
		}
	}
}

// replicaStep is, now and then, a replica crashing or coming back, a lease's session cut, or a
// replica's nodes changing their faults.
func (w *simWorld) replicaStep() error {
	rs := &w.replicas
	if !rs.on {
		return nil
	}
	switch x := rs.r.IntN(100); {
	case x < 3:
		rp := rs.all[rs.r.IntN(len(rs.all))]
		if rp.engine != nil {
			w.crash(rp)
		}
	case x < 13:
		rp := rs.all[rs.r.IntN(len(rs.all))]
		if rp.engine == nil {
			w.restart(rp)
		}
	case x < 15:
		k := w.signers[rs.r.IntN(len(w.signers))]
		if who := rs.leaser.Cut(w.network.ID, crypto.PubkeyToAddress(k.PublicKey)); who != "" {
			rs.cuts++
			fmt.Fprintf(&w.log, "sim: the lease session of %s on %s cut\n", crypto.PubkeyToAddress(k.PublicKey), who)
		}
	case x < 17:
		// A replica will die at a point of its work: before or after a commit, after a
		// broadcast, a receipt, or a caller's claim of a success.
		rp := rs.all[rs.r.IntN(len(rs.all))]
		points := []settle.FaultPoint{settle.FaultBeforeCommit, settle.FaultAfterCommit, settle.FaultAfterBroadcast,
			settle.FaultAfterReceipt, settle.FaultAfterClaim}
		rp.dieAt = points[rs.r.IntN(len(points))]
	case x < 20:
		w.replicaFaults()
	}
	return nil
}

// crash ends rp's process without grace: its sessions end (its leases are lost, the keys free for
// the others), and nothing of its memory runs again (its unwritten confirmations, its flights).
func (w *simWorld) crash(rp *simReplica) {
	w.replicas.crashes++
	fmt.Fprintf(&w.log, "sim: replica %s crashed\n", rp.name)
	rp.proc.End() // its sessions end with it; nothing else of it runs again (not even a Stop)
	rp.engine = nil
}

// died is the death of e's process where the world says a process dies (between a claim and its
// answer, or its answer and its confirmation): in a world of replicas, e's replica crashes; in a
// world of one engine, the engine only hears nothing more of the claim.
func (w *simWorld) died(e *settle.Engine) {
	for _, rp := range w.replicas.all {
		if rp.engine == e {
			w.crash(rp)
		}
	}
}

// up reports whether e is a replica still running.
func (w *simWorld) up(e *settle.Engine) bool { return slices.Contains(w.engines(), e) }

// restart brings rp's slot back: a new process over the same ledger, started (the keys nobody
// holds, recovered from the ledger). A start that fails (the ledger's faults) leaves it down.
func (w *simWorld) restart(rp *simReplica) {
	w.boot(rp)
	if err := rp.engine.Start(w.ctx); err != nil {
		fmt.Fprintf(&w.log, "sim: replica %s did not start: %v\n", rp.name, err)
		rp.proc.End()
		rp.engine = nil
		return
	}
	w.replicas.restarts++
	fmt.Fprintf(&w.log, "sim: replica %s started\n", rp.name)
	if rp == w.replicas.all[0] {
		w.engine = rp.engine
	}
}

// replicasAtEnd brings every replica back, and their nodes' faults and deaths off, for the end's
// retries.
func (w *simWorld) replicasAtEnd() error {
	rs := &w.replicas
	if !rs.on {
		return nil
	}
	for _, rp := range rs.all {
		rp.dieAt = "" // from here on nobody dies
		for _, b := range rp.nodes {
			b.SetProfile(settlesim.Profile{})
		}
		if rp.engine == nil {
			w.restart(rp)
			if rp.engine == nil {
				return fmt.Errorf("replica %s does not start without faults", rp.name)
			}
		}
	}
	return nil
}

// sent records a transaction of ours a replica sends.
func (rs *simReplicas) sent(replica string, k spyKey, h common.Hash) {
	if !rs.on {
		return
	}
	replica = strings.TrimSpace(replica)
	holder := rs.leaser.Holder(rs.network, k.from)
	if holder != replica && len(rs.violations) < 5 {
		rs.violations = append(rs.violations, fmt.Sprintf("replica %s sent %s (signer %s nonce %d) while %s held the key's lease",
			replica, h, k.from, k.nonce, orNobody(holder)))
	}
	for _, s := range rs.sends[k] {
		if s.hash == h && s.replica == replica {
			return
		}
	}
	rs.sends[k] = append(rs.sends[k], simSend{replica: replica, hash: h})
}

// checkLeases holds the replicas to invariant 7 (a signer key is leased to one process at a time,
// never shared), read off the leaser's journal and the transactions the replicas sent:
//
//  1. one holder at a time: a key's leases never overlap (each ends before the next begins);
//  2. no write through a lease that had ended committed anything (a write journaled lost wrote
//     nothing: its transaction is not in the ledger unless another write put it there);
//  3. every transaction a replica sent was written, at its key and nonce, through a lease of its
//     key before it was sent (write before broadcast, across replicas);
//  4. a replica sends a key's transaction only while it holds the key's lease (a stepped engine
//     learns of a lost lease at the start of its step, before anything of the step is sent);
//  5. at one key and nonce, once a transaction a later lease wrote there was sent (a fee bump, a
//     re-sign, or a new settlement at a nonce no row held any more: the ledger's unique nonce
//     refuses any other), no replica sends for the first time a transaction an earlier lease
//     wrote there (an old holder's late broadcast racing the new holder's transaction).
func (w *simWorld) checkLeases() error {
	rs := &w.replicas
	if !rs.on {
		return nil
	}
	if len(rs.violations) > 0 {
		return fmt.Errorf("signer leases: %s", strings.Join(rs.violations, "; "))
	}
	grants := rs.leaser.Grants()
	last := map[common.Address]settlesim.LeaseGrant{}
	for _, g := range grants {
		if p, ok := last[g.Signer]; ok && (p.Ended.IsZero() || g.Taken.Before(p.Ended)) {
			return fmt.Errorf("signer %s leased to %s (epoch %d) at %s while %s held it (epoch %d, ended %s)", g.Signer, g.Process, g.Epoch,
				g.Taken, p.Process, p.Epoch, p.Ended)
		}
		last[g.Signer] = g
	}
	// Who wrote each transaction: its first write through a lease that held (a write answered
	// an error may have committed).
	type writ struct {
		w     settlesim.LeaseWrite
		nonce uint64
	}
	wrote := map[common.Hash]writ{}
	for _, lw := range rs.leaser.Writes() {
		for i, h := range lw.Txs {
			if _, ok := wrote[h]; ok {
				continue
			}
			if lw.Lost {
				if r, err := w.ledger.SettlementByTx(settlesim.WithoutFaults(w.ctx), h); err == nil && r != nil {
					if _, later := wrote[h]; !later && !writtenUnlost(rs.leaser.Writes(), h) {
						return fmt.Errorf("transaction %s is in the ledger, written only through %s's lost lease (epoch %d)", h, lw.Process, lw.Epoch)
					}
				}
				continue
			}
			n := lw.Nonces[0]
			if i < len(lw.Nonces) {
				n = lw.Nonces[i]
			}
			wrote[h] = writ{lw, n}
		}
	}
	keys := make([]spyKey, 0, len(rs.sends))
	for k := range rs.sends {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b spyKey) int {
		if c := a.from.Cmp(b.from); c != 0 {
			return c
		}
		return int(a.nonce) - int(b.nonce)
	})
	for _, k := range keys {
		sends := rs.sends[k]
		var maxEpoch int64
		for _, s := range sends {
			wr, ok := wrote[s.hash]
			switch {
			case !ok:
				return fmt.Errorf("replica %s sent %s (signer %s nonce %d), which no lease wrote", s.replica, s.hash, k.from, k.nonce)
			case wr.w.Signer != k.from || wr.nonce != k.nonce:
				return fmt.Errorf("replica %s sent %s at signer %s nonce %d; it was written at signer %s nonce %d", s.replica, s.hash, k.from, k.nonce,
					wr.w.Signer, wr.nonce)
			}
			first := true
			for _, o := range sends {
				if o.hash == s.hash {
					first = o == s
					break
				}
			}
			if first && wr.w.Epoch < maxEpoch {
				return fmt.Errorf("replica %s first sent %s (signer %s nonce %d, written under epoch %d by %s) after epoch %d wrote at that nonce",
					s.replica, s.hash, k.from, k.nonce, wr.w.Epoch, wr.w.Process, maxEpoch)
			}
			maxEpoch = max(maxEpoch, wr.w.Epoch)
		}
	}
	return nil
}

// resentBump reports whether replica's send of the fee bump h is a resend under a lease other
// than the one that wrote it: the key's next holder (another process, or the same one after it
// lost the key and took it again) resending the ledger's latest bytes in its recovery, which
// decides no bump.
func (rs *simReplicas) resentBump(replica string, signer common.Address, h common.Hash) bool {
	var wrote int64
	for _, lw := range rs.leaser.Writes() {
		if lw.Op == "add-tx" && !lw.Lost && lw.Txs[0] == h {
			wrote = lw.Epoch
			break
		}
	}
	var holding int64
	for _, g := range rs.leaser.Grants() {
		if g.Signer == signer && g.Process == replica {
			holding = g.Epoch
		}
	}
	return wrote != holding
}

func orNobody(s string) string {
	if s == "" {
		return "nobody"
	}
	return s
}

func writtenUnlost(ws []settlesim.LeaseWrite, h common.Hash) bool {
	for _, lw := range ws {
		if !lw.Lost && slices.Contains(lw.Txs, h) {
			return true
		}
	}
	return false
}

// replicaStats adds the replicas' counts to the world's.
func (w *simWorld) replicaStats() {
	rs := &w.replicas
	if !rs.on {
		return
	}
	w.stats.replicaWorlds++
	w.stats.replicas += len(rs.all)
	w.stats.crashes += rs.crashes
	w.stats.midCall += rs.midCall
	w.stats.restarts += rs.restarts
	w.stats.cuts += rs.cuts
	w.stats.seconds += rs.seconds
	holder := map[common.Address]string{}
	for _, g := range rs.leaser.Grants() {
		if p, ok := holder[g.Signer]; ok && p != g.Process {
			w.stats.takeovers++
		}
		holder[g.Signer] = g.Process
	}
}

// wallClockless is a log without its time= stamps (the handler's wall clock).
func wallClockless(log string) string {
	lines := strings.Split(log, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "time=") {
			if j := strings.IndexByte(l, ' '); j > 0 {
				lines[i] = l[j+1:]
			}
		}
	}
	return strings.Join(lines, "\n")
}
