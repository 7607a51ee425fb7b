package loadgen

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and a ')' of its own: fields are counted from the last ')'.
	line := "4242 (we (ird) name) S 1 4242 4242 0 -1 4194304 4453 44424 0 6 171 29 43 150 20 0 1 0 1913583 222470144 7510 18446744073709551615\n"
	u, s, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if u != 171 || s != 29 {
		t.Fatalf("utime, stime = %d, %d; want 171, 29", u, s)
	}
	for _, bad := range []string{"", "4242 no parens S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 4242 4242 0 -1 4194304 4453 44424 0 6 x 29 43"} {
		if _, _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

func TestAuxvClkTck(t *testing.T) {
	vec := func(pairs ...uint64) []byte {
		b := make([]byte, 8*len(pairs))
		for i, v := range pairs {
			binary.NativeEndian.PutUint64(b[8*i:], v)
		}
		return b
	}
	if got := auxvClkTck(vec(6, 4096, atClkTck, 250, 0, 0)); got != 250 {
		t.Errorf("AT_CLKTCK 250 read as %d", got)
	}
	if got := auxvClkTck(vec(6, 4096, 0, 0, atClkTck, 250)); got != 100 {
		t.Errorf("an entry after AT_NULL was read: %d", got)
	}
	if got := auxvClkTck(nil); got != 100 {
		t.Errorf("no vector: %d, want 100", got)
	}
	if got := clockTicks(); got != 100 {
		t.Logf("this kernel's USER_HZ is %d", got) // not an error: the figures divide by it
	}
}

func TestMsPerOp(t *testing.T) {
	p := &CPUPhase{Ops: 200, ClkTck: 100, Roles: []RoleCPU{
		{Role: RoleFacilitator, Ticks: 50},             // 500 ms over 200 ops
		{Role: RolePostgres, Ticks: 0},                 // measured, nothing spent
		{Role: RoleNode, Ticks: 9, Err: "no such pid"}, // not measured
	}}
	if ms, ok := p.MsPerOp(RoleFacilitator); !ok || ms != 2.5 {
		t.Errorf("facilitator: %v ms (%v), want 2.5", ms, ok)
	}
	if ms, ok := p.MsPerOp(RolePostgres); !ok || ms != 0 {
		t.Errorf("postgres: %v ms (%v), want 0 measured", ms, ok)
	}
	if _, ok := p.MsPerOp(RoleNode); ok {
		t.Error("an unmeasured role has a figure")
	}
	if _, ok := p.MsPerOp(RoleLoadgen); ok {
		t.Error("a missing role has a figure")
	}
	if _, ok := (&CPUPhase{ClkTck: 100, Roles: p.Roles}).MsPerOp(RoleFacilitator); ok {
		t.Error("zero operations have a figure")
	}
}

func TestSpanTicks(t *testing.T) {
	// 1 ran throughout, 2 came during the phase (counted from 0), 3 went (counted to its last
	// sample), 4 is a reused pid whose counter went down (not counted).
	first := map[int]uint64{1: 100, 2: 0, 3: 40, 4: 500}
	last := map[int]uint64{1: 130, 2: 7, 3: 45, 4: 20}
	if got := spanTicks(first, last); got != 30+7+5 {
		t.Fatalf("spanTicks = %d, want 42", got)
	}
}

// The helper child: listens on a loopback port, prints it, and on "burn <n>" spends n clock
// ticks of CPU (counted by the kernel, not by a clock) before answering "done".
func init() {
	if os.Getenv("LOADGEN_CPU_HELPER") != "1" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(2)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var n uint64
		if _, err := fmt.Sscanf(sc.Text(), "burn %d", &n); err != nil {
			os.Exit(3)
		}
		start, _ := procTicks(os.Getpid())
		for x := 0; ; x++ {
			if x%100000 == 0 {
				if now, _ := procTicks(os.Getpid()); now >= start+n {
					break
				}
			}
		}
		fmt.Println("done")
	}
	os.Exit(0)
}

// TestProcessLookupAndCPU finds a real child by the port it listens on and measures the CPU it
// spends between the meter's start and finish.
func TestProcessLookupAndCPU(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "LOADGEN_CPU_HELPER=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	out := bufio.NewScanner(outPipe)
	if !out.Scan() {
		t.Fatal("the helper printed no port")
	}
	var port int
	if _, err := fmt.Sscan(out.Text(), &port); err != nil {
		t.Fatal(err)
	}

	pid, err := urlPID(fmt.Sprintf("http://127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	if pid != cmd.Process.Pid {
		t.Fatalf("port %d: found pid %d, the child is %d", port, pid, cmd.Process.Pid)
	}
	if _, err := urlPID("http://127.0.0.1"); err == nil || !strings.Contains(err.Error(), "no port") {
		t.Errorf("a URL without a port: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const burn = 20 // ticks: 200 ms at USER_HZ 100
	m := startCPU(ctx, []cpuSource{fixedSource(RoleNode, pid, nil), fixedSource(RoleNode+" gone", 1<<30, nil),
		fixedSource(RoleFacilitator, -1, nil)}, 10*time.Millisecond)
	fmt.Fprintf(in, "burn %d\n", burn)
	if !out.Scan() || out.Text() != "done" {
		t.Fatalf("the helper did not burn: %q", out.Text())
	}
	p := m.finish(ctx, 4)
	r := p.Role(RoleNode)
	if r.Err != "" || r.PIDs != 1 {
		t.Fatalf("child: %+v", r)
	}
	if r.Ticks < burn {
		t.Fatalf("measured %d ticks of a child that spent at least %d", r.Ticks, burn)
	}
	if ms, ok := p.MsPerOp(RoleNode); !ok || ms < float64(burn)*1000/float64(p.ClkTck)/4 {
		t.Errorf("per op: %v ms (%v)", ms, ok)
	}
	if g := p.Role(RoleNode + " gone"); g.Err == "" {
		t.Errorf("a pid that does not exist was measured: %+v", g)
	}
	if s := p.Role(RoleFacilitator); s.Err != "skipped" {
		t.Errorf("a skipped role: %+v", s)
	}
}

// TestBackendSetChanges: processes that a list adds or drops mid-phase are counted as came and
// went, with a newcomer's CPU counted from zero.
func TestBackendSetChanges(t *testing.T) {
	me := os.Getpid()
	parent := os.Getppid()
	lists := [][]int{{me}, {me, parent}, {parent}}
	i := 0
	list := func(context.Context) ([]int, error) {
		l := lists[min(i, len(lists)-1)]
		i++
		return l, nil
	}
	m := &cpuMeter{sources: []cpuSource{{role: RolePostgres, list: list}}, clk: 100,
		spans: []*cpuSpan{{first: map[int]uint64{}, last: map[int]uint64{}, seen: map[int]bool{}}}}
	ctx := context.Background()
	m.poll(ctx, true)
	m.poll(ctx, false)
	m.poll(ctx, false)
	sp := m.spans[0]
	if sp.came != 1 || sp.went != 1 || len(sp.first) != 2 {
		t.Fatalf("came %d went %d pids %d; want 1, 1, 2", sp.came, sp.went, len(sp.first))
	}
	if sp.first[parent] != 0 {
		t.Errorf("a newcomer counts from %d, want 0", sp.first[parent])
	}
}

func TestRenderCPU(t *testing.T) {
	r := sampleReport(true)
	roles := func(fac, node, loadgen uint64, pg *RoleCPU) []RoleCPU {
		return []RoleCPU{{Role: RoleFacilitator, Ticks: fac}, {Role: RoleNode, Ticks: node}, *pg, {Role: RoleLoadgen, Ticks: loadgen}}
	}
	// Ours: 1000 settlements; facilitator 80 ticks = 800 ms = 0.8 ms each; official: 200
	// settlements, facilitator 280 ticks = 14 ms each.
	r.Ours.VerifyCPU = &CPUPhase{Ops: 20000, ClkTck: 100, Roles: roles(1260, 200, 400, &RoleCPU{Role: RolePostgres, Ticks: 100, PIDs: 5})}
	r.Ours.SettleCPU = &CPUPhase{Ops: 1000, ClkTck: 100, Roles: roles(80, 90, 250, &RoleCPU{Role: RolePostgres, Ticks: 65, PIDs: 9, Came: 2, Went: 1})}
	r.Ref.VerifyCPU = &CPUPhase{Ops: 1000, ClkTck: 100, Roles: roles(1640, 30, 20, &RoleCPU{Role: RolePostgres, Err: "n/a (no database)"})}
	r.Ref.SettleCPU = &CPUPhase{Ops: 200, ClkTck: 100, Roles: roles(280, 108, 50, &RoleCPU{Role: RolePostgres, Err: "n/a (no database)"})}
	r.Ours.Lookup = &LookupResult{Concurrency: 32, Elapsed: 10 * time.Second, Requests: 40000, Failed: 1, FirstFailed: "HTTP 503",
		Latencies: Latencies{time.Millisecond, 3 * time.Millisecond}}
	r.Ours.LookupCPU = &CPUPhase{Ops: 40000, ClkTck: 100, Roles: roles(800, 0, 400, &RoleCPU{Role: RolePostgres, Ticks: 300, PIDs: 5})}
	r.Ours.Settle.Chain.SenderGas = 1000 * 86_000
	r.Ref.Settle.Chain.SenderGas = 200 * 86_100
	r.Ours.Chain, r.Ours.HeadAtStart = "http://a", 19
	r.Ref.Chain, r.Ref.HeadAtStart = "http://b", 19
	var b strings.Builder
	if err := Render(&b, r); err != nil {
		t.Fatal(err)
	}
	out := squeezeSpaces(b.String())
	t.Log("\n" + b.String())
	for _, want := range []string{
		"per valid /verify, concurrency 32 (20000 ops; official 1000)",
		// 1260 ticks / 20000 = 0.63 ms; 1640 / 1000 = 16.4 ms; ratio 0.038
		"facilitator 0.630 ms 16.4 ms 0.038x",
		"Postgres (our database's backends) 0.050 ms n/a (no database)",
		"per confirmed settlement (1000 ops; official 200)",
		"facilitator 0.800 ms 14.0 ms 0.057x",
		"chain node (anvil) 0.900 ms 5.400 ms 0.167x",
		"Postgres (our database's backends) 0.650 ms n/a (no database)",
		"load generator (this process) 2.500 ms 2.500 ms 1.000x",
		// ours 0.8+0.9+0.65+2.5 = 4.85; official 14+5.4+2.5 = 21.9
		"sum of the measured 4.850 ms 21.9 ms 0.221x",
		// 800 ticks / 40000 = 0.2 ms; the official has no status API.
		"status lookups (GET /v1/authorizations/…), concurrency 32, 10s",
		"answered/s 4000.0/s n/a (no status API)",
		"per status lookup (40000 ops; official —)",
		"facilitator 0.200 ms n/a (no status API)",
		"Postgres (our database's backends) 0.075 ms n/a (no status API)",
		"ours status lookups first failure: HTTP 503",
		"gas per settlement (signer txs' gasUsed / on-chain transfers) 86000 86100 0.999x",
		"ours http://a (head 19 at start), official http://b (head 19 at start)",
		"9 backends of our database counted, 2 opened and 1 closed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func squeezeSpaces(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' }), " ")
}
