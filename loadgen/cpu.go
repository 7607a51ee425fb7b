package loadgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// The CPU a phase costs each process, from the kernel's own accounting: utime+stime of
// /proc/<pid>/stat, before and after the phase. The thread group leader's line sums every thread,
// including threads that have exited, so one read per process is enough.

// parseStat returns utime and stime (fields 14 and 15, in clock ticks) of a /proc/<pid>/stat
// line. The command name (field 2) is in parentheses and may hold spaces or parentheses itself,
// so the fields are counted from the last ')'.
func parseStat(line []byte) (utime, stime uint64, err error) {
	i := bytes.LastIndexByte(line, ')')
	if i < 0 {
		return 0, 0, errors.New("stat: no command name")
	}
	fs := bytes.Fields(line[i+1:])
	// fs[0] is field 3 (state); utime is field 14, stime 15.
	if len(fs) < 13 {
		return 0, 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(fs))
	}
	if utime, err = strconv.ParseUint(string(fs[11]), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stat: utime: %w", err)
	}
	if stime, err = strconv.ParseUint(string(fs[12]), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stat: stime: %w", err)
	}
	return utime, stime, nil
}

// procTicks is a process's utime+stime so far, in clock ticks.
func procTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	u, s, err := parseStat(b)
	return u + s, err
}

// atClkTck is the auxiliary vector's AT_CLKTCK: the kernel hands every process the tick rate of
// /proc's times there, and sysconf(_SC_CLK_TCK) reads it from the same place.
const atClkTck = 17

// clockTicks is the tick rate of /proc/<pid>/stat's times; 100 (Linux's USER_HZ) when the
// auxiliary vector cannot be read.
func clockTicks() uint64 {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	return auxvClkTck(b)
}

// auxvClkTck finds AT_CLKTCK in a 64-bit auxiliary vector (pairs of native-endian words).
func auxvClkTck(b []byte) uint64 {
	for i := 0; i+16 <= len(b); i += 16 {
		k, v := binary.NativeEndian.Uint64(b[i:]), binary.NativeEndian.Uint64(b[i+8:])
		if k == atClkTck && v > 0 {
			return v
		}
		if k == 0 {
			break
		}
	}
	return 100
}

// Roles of the processes a phase costs.
const (
	RoleFacilitator = "facilitator"
	RoleNode        = "chain node (anvil)"
	RolePostgres    = "Postgres (our database's backends)"
	RoleLoadgen     = "load generator (this process)"
)

// BackendLister lists the process ids of the Postgres backends that serve the facilitator's
// database (pg_stat_activity), leaving out the lister's own connection.
type BackendLister interface {
	BackendPIDs(ctx context.Context) ([]int, error)
}

// cpuSource is one role's processes: a fixed pid, or a set that changes (Postgres backends).
type cpuSource struct {
	role string
	pid  int
	list func(ctx context.Context) ([]int, error)
	err  string // why the role is not measured
}

// RoleCPU is what one role's processes cost over a phase.
type RoleCPU struct {
	Role  string
	Ticks uint64 // utime+stime over the phase, summed over the role's processes
	PIDs  int    // processes counted
	// Came and Went are processes that appeared or vanished during the phase (Postgres backends
	// a pool opened or closed): a newcomer's whole CPU counts (it started during the phase); one
	// that went counts up to its last sample, so up to one sampling interval of it is lost.
	Came, Went int
	Err        string // not measured, and why
}

// CPUPhase is the CPU each role cost during one phase of Elapsed, for Ops operations.
type CPUPhase struct {
	Ops     int
	ClkTck  uint64
	Elapsed time.Duration
	Roles   []RoleCPU
}

// MsPerSecond is a role's CPU milliseconds per second of the phase; ok is false when the role was
// not measured.
func (p *CPUPhase) MsPerSecond(role string) (ms float64, ok bool) {
	r := p.Role(role)
	if r == nil || r.Err != "" || p.ClkTck == 0 || p.Elapsed <= 0 {
		return 0, false
	}
	return float64(r.Ticks) * 1000 / float64(p.ClkTck) / p.Elapsed.Seconds(), true
}

// MsPerOp is a role's CPU milliseconds per operation; ok is false when the role was not measured
// or nothing was done.
func (p *CPUPhase) MsPerOp(role string) (ms float64, ok bool) {
	if p == nil || p.Ops == 0 || p.ClkTck == 0 {
		return 0, false
	}
	for _, r := range p.Roles {
		if r.Role == role {
			if r.Err != "" {
				return 0, false
			}
			return float64(r.Ticks) * 1000 / float64(p.ClkTck) / float64(p.Ops), true
		}
	}
	return 0, false
}

// Role is the named role's figures (nil if the phase has none).
func (p *CPUPhase) Role(role string) *RoleCPU {
	if p == nil {
		return nil
	}
	for i := range p.Roles {
		if p.Roles[i].Role == role {
			return &p.Roles[i]
		}
	}
	return nil
}

// cpuSpan is the per-pid accounting of one role during a phase.
type cpuSpan struct {
	first, last map[int]uint64
	seen        map[int]bool // listed at the last poll
	came, went  int
	err         string
}

// cpuMeter samples every role's processes from start to stop. Fixed pids need only the two
// ends, but a backend that a pool closes mid-phase would take its CPU with it, so the lists are
// polled every interval.
type cpuMeter struct {
	sources []cpuSource
	every   time.Duration
	clk     uint64
	began   time.Time

	mu    sync.Mutex
	spans []*cpuSpan
	stop  context.CancelFunc
	done  chan struct{}
}

func startCPU(ctx context.Context, sources []cpuSource, every time.Duration) *cpuMeter {
	m := &cpuMeter{sources: sources, every: every, clk: clockTicks(), began: time.Now(), done: make(chan struct{})}
	for range sources {
		m.spans = append(m.spans, &cpuSpan{first: map[int]uint64{}, last: map[int]uint64{}, seen: map[int]bool{}})
	}
	m.poll(ctx, true)
	// Stopping ends the loop between polls, never a poll itself: a listing query cancelled midway
	// closes its connection (pgx does), and the next phase would list nothing. Each poll is bounded
	// by its own timeout.
	pollCtx := context.WithoutCancel(ctx)
	ctx, m.stop = context.WithCancel(ctx)
	go func() {
		defer close(m.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				m.poll(pollCtx, false)
			}
		}
	}()
	return m
}

// poll reads every role's processes once. At the first poll every process present is a starter
// (its CPU counts from now); a process first listed later started during the phase, and its CPU
// counts from zero.
func (m *cpuMeter) poll(ctx context.Context, first bool) {
	for i, s := range m.sources {
		if s.err != "" {
			continue
		}
		pids := []int{s.pid}
		if s.list != nil {
			lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var err error
			pids, err = s.list(lctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					m.mu.Lock()
					m.spans[i].err = "listing processes: " + err.Error()
					m.mu.Unlock()
				}
				continue
			}
		}
		ticks := map[int]uint64{}
		for _, pid := range pids {
			if t, err := procTicks(pid); err == nil {
				ticks[pid] = t
			} else if s.list == nil {
				m.mu.Lock()
				m.spans[i].err = fmt.Sprintf("pid %d: %v", pid, err)
				m.mu.Unlock()
			}
		}
		m.mu.Lock()
		sp := m.spans[i]
		for pid, t := range ticks {
			if _, ok := sp.first[pid]; !ok {
				if first {
					sp.first[pid] = t
				} else {
					sp.first[pid] = 0
					sp.came++
				}
			}
			sp.last[pid] = t
		}
		for pid := range sp.seen {
			if _, ok := ticks[pid]; !ok {
				sp.went++
			}
		}
		sp.seen = map[int]bool{}
		for pid := range ticks {
			sp.seen[pid] = true
		}
		m.mu.Unlock()
	}
}

// finish takes a last sample, stops, and returns the phase's figures for ops operations.
func (m *cpuMeter) finish(ctx context.Context, ops int) *CPUPhase {
	m.stop()
	<-m.done
	m.poll(ctx, false)
	m.mu.Lock()
	defer m.mu.Unlock()
	p := &CPUPhase{Ops: ops, ClkTck: m.clk, Elapsed: time.Since(m.began)}
	for i, s := range m.sources {
		sp := m.spans[i]
		r := RoleCPU{Role: s.role, Err: s.err, Came: sp.came, Went: sp.went, PIDs: len(sp.first)}
		if r.Err == "" {
			r.Err = sp.err
		}
		r.Ticks = spanTicks(sp.first, sp.last)
		p.Roles = append(p.Roles, r)
	}
	return p
}

// spanTicks sums each process's last sample minus its first.
func spanTicks(first, last map[int]uint64) uint64 {
	var sum uint64
	for pid, f := range first {
		if l := last[pid]; l > f {
			sum += l - f
		}
	}
	return sum
}
