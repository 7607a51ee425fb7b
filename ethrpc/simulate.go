package ethrpc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
)

// simulations runs the transaction simulations of concurrent callers together.
//
// A node spends most of an eth_call on setting up the call, not on running a token transfer:
// measured on anvil, one eth_call of transferWithAuthorization costs it about 0.2-0.3 ms of CPU,
// while twenty of them in one eth_simulateV1 cost about 0.04 ms each. Under load that setup was
// the largest share of the node's work per settlement. So while one simulation is in flight, the
// callers that arrive wait for it and then go as one group: one request with every member's other
// reads, each its own call as before, and one eth_simulateV1 of every member's simulation. A lone
// caller goes at once, alone, as before: grouping adds no wait to an idle service.
//
// A member's answer from a group is the one its simulation gives alone at the same head. The
// calls of one eth_simulateV1 run in order in one block and each sees the state the earlier ones
// left, so one caller's transfer could fund another's (a payer holding nothing, paid by an
// authorization that was itself refused, was answered valid). So a simulation joins the group
// only when it names the accounts whose state decides its outcome (Read.Depends) and those it
// changes (Read.Changes), and no member changes what another depends on (compatible); any other
// runs alone, as its own eth_call in the same request. Then each member's outcome rests only on
// state no other member changed: what it depends on is the latest state, as alone. A call at a
// gas limit whose gas (not outcome) an earlier member's change can lower (Read.GasDepends: a
// payment to a merchant another member pays, who held nothing) runs at that limit less the most
// it can lower it: alone it has that much more gas left at every step, and needs at most that
// much more. Further:
//   - A simulation that failed in the group is run again alone, and that answer stands (the
//     group's block is not the latest one but the next: its number and time are later).
//   - A node without eth_simulateV1 (it answers "method not found", or errors three times in a
//     row) is remembered, and every simulation after that goes alone. Any error of the group's
//     eth_simulateV1 runs that group's simulations alone.
//
// The lag check covers the group as it covers one read: the request asks for the head with the
// rest.
type simulations struct {
	mu   sync.Mutex
	busy bool      // a simulation is in flight
	next *simGroup // the callers waiting for it, who go next as one group

	unsupported atomic.Bool  // the node answered eth_simulateV1 with "method not found", or kept failing it
	failures    atomic.Int32 // eth_simulateV1 answers in a row that were errors
}

// simFailuresToGiveUp is how many eth_simulateV1 errors in a row make the node count as one
// without it: a node that rejects the request's shape would otherwise cost an extra request per
// group for ever.
const simFailuresToGiveUp = 3

// maxSimGroup bounds a group: one eth_simulateV1's calls share one block's gas limit (a
// transfer's simulation is capped near 130,000 gas; 64 of them need under 9M, within any chain's
// block), and a caller beyond it goes alone rather than wait.
const maxSimGroup = 64

// groupTimeout bounds a group's request when the Reader has no Timeout.
const groupTimeout = 10 * time.Second

type simGroup struct {
	members []*simMember
	done    chan struct{}
}

// simMember is one caller's reads, copied: a caller that gives up waiting must not see its reads
// written later.
type simMember struct {
	reads []*Read
	err   error
}

func (rd *Read) simulated() bool { return rd.Simulate && !rd.Code && !rd.Estimate }

func (s *simulations) read(ctx context.Context, r *Reader, reads []*Read) error {
	if s.unsupported.Load() {
		return r.read(ctx, reads)
	}
	s.mu.Lock()
	if !s.busy {
		s.busy = true
		s.mu.Unlock()
		err := r.read(ctx, reads)
		s.release(r)
		return err
	}
	g := s.next
	if g == nil {
		g = &simGroup{done: make(chan struct{})}
		s.next = g
	}
	if len(g.members) >= maxSimGroup {
		s.mu.Unlock()
		return r.read(ctx, reads)
	}
	m := &simMember{reads: make([]*Read, len(reads))}
	for i, rd := range reads {
		c := *rd
		m.reads[i] = &c
	}
	g.members = append(g.members, m)
	s.mu.Unlock()
	if r.Queued != nil {
		r.Queued()
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if m.err != nil {
		return m.err
	}
	for i, rd := range reads {
		*rd = *m.reads[i]
	}
	return nil
}

// release hands the in-flight slot to the group that formed while it was held, or frees it.
func (s *simulations) release(r *Reader) {
	s.mu.Lock()
	g := s.next
	s.next = nil
	if g == nil {
		s.busy = false
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	go func() {
		s.run(r, g)
		close(g.done)
		s.release(r)
	}()
}

// simEntry is one simulation of a group and the member it belongs to.
type simEntry struct {
	member *simMember
	read   *Read
}

// run answers every member of g. The members' own contexts are not used: the request serves
// them all, so it is bounded by the Reader's Timeout alone.
func (s *simulations) run(r *Reader, g *simGroup) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = groupTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	type plainPart struct {
		member  *simMember
		reads   []*Read
		from    int // its first element in elems
		results []readResult
	}
	var (
		parts   []plainPart
		elems   []rpc.BatchElem
		grouped []simEntry
		alone   []simEntry
	)
	for _, m := range g.members {
		var plain []*Read
		for _, rd := range m.reads {
			if !rd.simulated() {
				plain = append(plain, rd)
				continue
			}
			grouped = append(grouped, simEntry{m, rd})
		}
		e, res := readElems(plain)
		parts = append(parts, plainPart{member: m, reads: plain, from: len(elems), results: res})
		elems = append(elems, e...)
	}
	grouped, apart := together(grouped)
	apartReads := make([]*Read, len(apart))
	for i, e := range apart {
		apartReads[i] = e.read
	}
	apartAt := len(elems)
	e, apartResults := readElems(apartReads)
	elems = append(elems, e...)
	calls := make([]callArgs, len(grouped))
	for i, e := range grouped {
		calls[i] = e.read.callArgs()
		if rd := e.read; rd.GasCap > 0 && changedBefore(grouped[:i], rd.GasDepends) {
			g := hexutil.Uint64(rd.GasCap - rd.GasSurcharge)
			calls[i].Gas = &g
		}
	}
	var blocks []simBlock
	simAt := len(elems)
	if len(grouped) > 0 {
		elems = append(elems, rpc.BatchElem{Method: "eth_simulateV1", Result: &blocks,
			Args: []any{simPayload{BlockStateCalls: []simBlockCalls{{Calls: calls}}}, "latest"}})
	}

	if err := r.batch(ctx, elems); err != nil {
		for _, m := range g.members {
			m.err = err
		}
		return
	}
	for _, p := range parts {
		if err := applyReads(p.reads, elems[p.from:p.from+len(p.reads)], p.results); err != nil {
			p.member.err = err
		}
	}
	for i, e := range apart {
		at := apartAt + i
		if err := applyReads(apartReads[i:i+1], elems[at:at+1], apartResults[i:i+1]); err != nil && e.member.err == nil {
			e.member.err = err
		}
	}
	if len(grouped) == 0 {
		return
	}
	results, err := simResults(elems[simAt], blocks, len(grouped))
	if err != nil {
		if methodMissing(err) || s.failures.Add(1) >= simFailuresToGiveUp {
			s.unsupported.Store(true)
		}
		alone = append(alone, grouped...)
	} else {
		s.failures.Store(0)
		for i, e := range grouped {
			if results[i].Status != 1 {
				alone = append(alone, e)
				continue
			}
			e.read.Out, e.read.Reverted, e.read.RevertReason, e.read.Grouped = results[i].ReturnData, false, "", true
		}
	}
	s.alone(ctx, r, alone)
}

// together splits simulations, in arrival order, into those that go as one eth_simulateV1 and
// those that run alone. A simulation joins when it names what it changes and is compatible with
// every one that joined before it; fewer than two that join gain nothing, and run alone too.
func together(entries []simEntry) (group, apart []simEntry) {
	for _, e := range entries {
		rd := e.read
		ok := len(rd.Changes) > 0 && (rd.GasCap == 0 || len(rd.GasDepends) == 0 || rd.GasSurcharge < rd.GasCap)
		for _, g := range group {
			if !ok {
				break
			}
			ok = compatible(g.read, rd)
		}
		if ok {
			group = append(group, e)
		} else {
			apart = append(apart, e)
		}
	}
	if len(group) < 2 {
		return nil, append(apart, group...)
	}
	return group, apart
}

// compatible says a and b may run in one block in either order and each answer as alone: neither
// changes an account the other's outcome depends on. (Both changing one account, as two payments
// to one merchant do, is fine: neither's outcome depends on it; a call at a gas limit whose gas
// it decides runs at a lower limit, see Read.GasDepends.)
func compatible(a, b *Read) bool {
	return !meet(a.Changes, b.Depends) && !meet(b.Changes, a.Depends)
}

// changedBefore says whether one of the calls before changed one of accounts.
func changedBefore(before []simEntry, accounts []common.Address) bool {
	for _, e := range before {
		if meet(e.read.Changes, accounts) {
			return true
		}
	}
	return false
}

func meet(x, y []common.Address) bool {
	for _, a := range x {
		if slices.Contains(y, a) {
			return true
		}
	}
	return false
}

// alone runs simulations each as its own eth_call, in one request, and gives each answer (or
// error) to its member.
func (s *simulations) alone(ctx context.Context, r *Reader, entries []simEntry) {
	var todo []simEntry
	for _, e := range entries {
		if e.member.err == nil {
			todo = append(todo, e)
		}
	}
	if len(todo) == 0 {
		return
	}
	reads := make([]*Read, len(todo))
	for i, e := range todo {
		reads[i] = e.read
	}
	elems, results := readElems(reads)
	if err := r.batch(ctx, elems); err != nil {
		for _, e := range todo {
			e.member.err = err
		}
		return
	}
	for i, e := range todo {
		if err := applyReads(reads[i:i+1], elems[i:i+1], results[i:i+1]); err != nil && e.member.err == nil {
			e.member.err = err
		}
	}
}

type simPayload struct {
	BlockStateCalls []simBlockCalls `json:"blockStateCalls"`
}

type simBlockCalls struct {
	Calls []callArgs `json:"calls"`
}

type simBlock struct {
	Calls []simCallResult `json:"calls"`
}

type simCallResult struct {
	ReturnData hexutil.Bytes  `json:"returnData"`
	Status     hexutil.Uint64 `json:"status"`
}

// simResults checks an eth_simulateV1 answer's shape: one block with one result per call.
func simResults(el rpc.BatchElem, blocks []simBlock, calls int) ([]simCallResult, error) {
	if el.Error != nil {
		return nil, el.Error
	}
	if len(blocks) != 1 || len(blocks[0].Calls) != calls {
		return nil, errors.New("eth_simulateV1: answer does not have one result per call")
	}
	return blocks[0].Calls, nil
}

// methodMissing tells a node that does not have the method from one that failed to run it.
func methodMissing(err error) bool {
	var rpcErr rpc.Error
	if errors.As(err, &rpcErr) && rpcErr.ErrorCode() == -32601 {
		return true
	}
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"method not found", "does not exist", "not supported", "unsupported method", "unknown method"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
