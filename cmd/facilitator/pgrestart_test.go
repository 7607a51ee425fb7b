package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// privatePostgres is a Postgres cluster of the test's own, which it may stop and start: the
// machine's shared cluster serves other packages' tests at the same time and is never touched.
type privatePostgres struct {
	t         *testing.T
	bin       string // the server's bin directory
	dir       string // data directory (owned by postgres)
	port      int
	socketDir string
	URL       string
	started   bool
}

// pgSite is where a test's own clusters live: a temporary directory owned by the postgres user,
// the server's binaries, and one socket directory for them all (each cluster's socket is named
// after its port).
type pgSite struct {
	t        *testing.T
	bin      string
	root     string
	uid, gid int
}

// newPgSite checks that the test can run clusters of its own: it needs root (to act as the
// postgres user) and Postgres's server binaries. Without them it skips, and fails under CI=true.
func newPgSite(t *testing.T) *pgSite {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("this test needs Postgres clusters of its own: %s", why)
		}
		t.Skipf("needs Postgres clusters of its own: %s", why)
	}
	if os.Geteuid() != 0 {
		missing("not root (initdb and pg_ctl run as the postgres user)")
	}
	initdbs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(initdbs) == 0 {
		missing("no /usr/lib/postgresql/*/bin/initdb")
	}
	sort.Strings(initdbs)
	pgUser, err := user.Lookup("postgres")
	if err != nil {
		missing("no postgres user")
	}
	s := &pgSite{t: t, bin: filepath.Dir(initdbs[len(initdbs)-1])}
	s.uid, _ = strconv.Atoi(pgUser.Uid)
	s.gid, _ = strconv.Atoi(pgUser.Gid)
	if s.root, err = os.MkdirTemp("", "x402-pgfault-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(s.root) })
	for _, d := range []string{s.root, filepath.Join(s.root, "sock")} {
		s.own(d)
	}
	return s
}

// own creates d (if missing) as the postgres user's.
func (s *pgSite) own(d string) {
	s.t.Helper()
	if err := os.MkdirAll(d, 0o700); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Chown(d, s.uid, s.gid); err != nil {
		s.t.Fatal(err)
	}
}

// cluster is the cluster in the data directory name (made by initdb or copied there), on a free
// port, not started; it is stopped at cleanup if it runs then.
func (s *pgSite) cluster(name, db string) *privatePostgres {
	s.t.Helper()
	_, portStr, _ := net.SplitHostPort(freeAddr(s.t))
	p := &privatePostgres{t: s.t, bin: s.bin, dir: filepath.Join(s.root, name), socketDir: filepath.Join(s.root, "sock")}
	p.port, _ = strconv.Atoi(portStr)
	p.URL = p.url(db)
	s.t.Cleanup(func() {
		if p.started {
			p.stop("immediate")
		}
	})
	return p
}

// initdb makes a new cluster in name, starts it and creates db.
func (s *pgSite) initdb(name, db string) *privatePostgres {
	s.t.Helper()
	p := s.cluster(name, db)
	s.own(p.dir)
	if out, err := p.asPostgres(filepath.Join(p.bin, "initdb"), "-D", p.dir, "-A", "trust", "-U", "postgres", "--no-sync").CombinedOutput(); err != nil {
		s.t.Fatalf("initdb: %v\n%s", err, out)
	}
	p.start()
	p.exec(`CREATE DATABASE ` + db)
	return p
}

// startPrivatePostgres runs initdb in a temporary directory and starts the cluster on a free
// port, with the database x402_faults (see newPgSite for what it needs).
func startPrivatePostgres(t *testing.T) *privatePostgres {
	t.Helper()
	return newPgSite(t).initdb("data", "x402_faults")
}

// url is the address of database db on the cluster, as the superuser.
func (p *privatePostgres) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// exec runs statements as the superuser in the cluster's postgres database.
func (p *privatePostgres) exec(sql string, args ...any) {
	p.t.Helper()
	p.execIn("postgres", sql, args...)
}

// execIn runs statements as the superuser in database db.
func (p *privatePostgres) execIn(db, sql string, args ...any) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.url(db))
	if err != nil {
		p.t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		p.t.Fatalf("%s: %v", sql, err)
	}
}

func (p *privatePostgres) asPostgres(name string, args ...string) *exec.Cmd {
	return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
}

// start starts the cluster and waits until it accepts connections.
func (p *privatePostgres) start() {
	p.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off", p.port, p.socketDir)
	cmd := p.asPostgres(filepath.Join(p.bin, "pg_ctl"), "-D", p.dir, "-o", opts, "-l", filepath.Join(p.dir, "server.log"), "-w", "-t", "60", "start")
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.dir, "server.log"))
		p.t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	p.started = true
}

// stop stops the cluster: mode fast (sessions are ended, a checkpoint is written) or immediate
// (the server dies; the next start runs crash recovery).
func (p *privatePostgres) stop(mode string) {
	p.t.Helper()
	cmd := p.asPostgres(filepath.Join(p.bin, "pg_ctl"), "-D", p.dir, "-w", "-t", "60", "-m", mode, "stop")
	if out, err := cmd.CombinedOutput(); err != nil {
		p.t.Fatalf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
	p.started = false
}

// TestFaultPostgresRestart stops the facilitator's Postgres under concurrent /settle load, keeps
// sending while it is down, and starts it again: while it is down every answer is a clean 503
// with an x402 body (or settlement_pending for settlements already committed), nothing reaches
// the chain without a committed row, and once it is back the facilitator recovers without
// manual steps: new settlements succeed, every earlier one resolves, and the audit holds.
func TestFaultPostgresRestart(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg := startPrivatePostgres(t)
	_, chain := faultStack(ctx, t, "")
	bin := buildFacilitator(ctx, t)
	load := newFaultLoad(ctx, t, chain, 4)
	env := serveEnv(t, pg.URL, chain, chain.RPCURL, load.key)
	env["FACILITATOR_LOG_LEVEL"] = "info"
	c := startServe(ctx, t, bin, env, "facilitator")
	target := func() *child { return c }

	for i, mode := range []string{"fast", "immediate"} {
		stop := make(chan struct{})
		workers := load.drive(ctx, target, 6, stop)
		time.Sleep(2 * time.Second)

		unavailable, lost, successes := load.unavailable.Load(), load.lost.Load(), load.successes.Load()
		pg.stop(mode)
		downAt := time.Now()
		time.Sleep(4 * time.Second) // requests keep coming while it is down
		downUnavailable := load.unavailable.Load() - unavailable
		downLost := load.lost.Load() - lost
		downSuccesses := load.successes.Load() - successes
		pg.start()
		downFor := time.Since(downAt)
		// After the restart, new payments must succeed again.
		recovered := load.successes.Load()
		var recoveredAfter time.Duration
		for waited := time.Now(); ; {
			if load.successes.Load() > recovered+10 {
				recoveredAfter = time.Since(waited)
				break
			}
			if time.Since(waited) > 60*time.Second {
				t.Fatalf("round %d: no new successes within 60s of Postgres coming back", i+1)
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(stop)
		workers.Wait()
		t.Logf("round %d (stop -m %s): Postgres down %s: %d clean 503s, %d successes answered as it went down, %d lost; settling again %s after the restart",
			i+1, mode, downFor.Round(time.Millisecond), downUnavailable, downSuccesses, downLost, recoveredAfter.Round(time.Millisecond))
		if downUnavailable == 0 {
			t.Fatalf("round %d: no 503 while Postgres was down: the outage was not exercised", i+1)
		}
		if downLost != 0 {
			t.Fatalf("round %d: %d requests got no HTTP answer while Postgres was down", i+1, downLost)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	load.settleAll(ctx, c)
	rep := load.audit(ctx, pg.URL, c)
	c.stop(t)
	t.Logf("postgres restart: %s; audit: %s; took %s", load.summary(), rep, time.Since(began).Round(time.Second))
	if rep.discrepancies != 0 || load.refused.Load() != 0 {
		t.Fatalf("%d discrepancies, %d answers not allowed", rep.discrepancies, load.refused.Load())
	}
}
