package api

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
)

// ReadyChecker is one dependency GET /readyz asks about. Ready returns nil when the dependency
// can serve. The error's text is the check's state in the /readyz body, so it must be short and
// free of secrets; a check still running when /readyz's bound passes reads "timeout".
type ReadyChecker interface {
	Ready(ctx context.Context) error
}

// ReadyFunc adapts a function to ReadyChecker.
type ReadyFunc func(ctx context.Context) error

// Ready implements ReadyChecker.
func (f ReadyFunc) Ready(ctx context.Context) error { return f(ctx) }

// ReadyResponse is the /readyz body: "ready", "degraded" or "unready", and each check's state
// ("ok", "timeout", or what failed).
type ReadyResponse struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
	// Degraded lists the networks a check of which failed while another network serves: the
	// process stays ready (200) for the others, which an orchestrator taking it out of service
	// would stop too. Absent when every network passes.
	Degraded []string `json:"degraded,omitempty"`
	// Endpoints is each RPC endpoint's state, for operators; it does not make the process
	// unready (a network serves while any of its endpoints does).
	Endpoints map[string]string `json:"endpoints,omitempty"`
	// Signers is each remote signer key's state ("ok, …", "down: …", "not contacted yet"), and
	// each retiring key's ("retiring: n open settlement(s) …", "retiring: drained …"), for
	// operators; it does not make the process unready (Config.ReadySigners says why).
	Signers map[string]string `json:"signers,omitempty"`
}

// maxStateText bounds a state's text in the body.
const maxStateText = 200

// readyCache holds /readyz's last answer: the checks run at most once per ReadyEvery, however
// many ask (an unkeyed, unlimited route must not turn each request into a call to every node),
// and callers who arrive while they run wait for that run instead of starting their own.
type readyCache struct {
	mu      sync.Mutex
	began   time.Time     // when the last run began
	answer  *readyAnswer  // the last run's; nil before the first ends
	running chan struct{} // closed when the current run ends; nil when none runs
}

type readyAnswer struct {
	status int
	body   ReadyResponse
}

// readyz answers from the last run of the checks while it is younger than ReadyEvery, else from a
// new run (shared by everyone asking meanwhile): 200 when all pass or some network is degraded
// while another serves (readiness), else 503. Unlike /healthz (is
// the process alive), it says whether this process should get traffic.
func (s *Server) readyz(c echo.Context) error {
	ctx := c.Request().Context()
	rc := &s.ready
	rc.mu.Lock()
	if rc.answer != nil && rc.running == nil && s.cfg.Now().Sub(rc.began) < s.cfg.ReadyEvery {
		a := rc.answer
		rc.mu.Unlock()
		return c.JSON(a.status, a.body)
	}
	done := rc.running
	if done == nil {
		done = make(chan struct{})
		rc.running, rc.began = done, s.cfg.Now()
		// The run belongs to everyone waiting on it: the request that happened to start it going
		// away must not cut it short.
		go func() {
			a := s.checkReady(context.WithoutCancel(ctx))
			rc.mu.Lock()
			rc.answer, rc.running = a, nil
			rc.mu.Unlock()
			close(done)
		}()
	}
	rc.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil // the caller is gone; the run goes on for the others
	}
	rc.mu.Lock()
	a := rc.answer
	rc.mu.Unlock()
	return c.JSON(a.status, a.body)
}

// checkReady runs every check at once within ReadyTimeout.
func (s *Server) checkReady(parent context.Context) *readyAnswer {
	ctx, cancel := context.WithTimeout(parent, s.cfg.ReadyTimeout)
	defer cancel()
	type result struct{ name, state string }
	results := make(chan result, len(s.cfg.Ready))
	for name, chk := range s.cfg.Ready {
		go func() {
			err := chk.Ready(ctx)
			state := "ok"
			switch {
			case err == nil:
			case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
				state = "timeout"
			default:
				state = err.Error()
				if len(state) > maxStateText {
					state = state[:maxStateText] + "…"
				}
			}
			results <- result{name, state}
		}()
	}
	res := ReadyResponse{Status: "ready", Checks: map[string]string{}}
	// A check that ignores its context cannot hold the answer past the bound.
	for range s.cfg.Ready {
		select {
		case r := <-results:
			res.Checks[r.name] = r.state
		case <-ctx.Done():
		}
	}
	for name := range s.cfg.Ready {
		if _, ok := res.Checks[name]; !ok {
			res.Checks[name] = "timeout"
		}
	}
	status := http.StatusOK
	switch verdict, degraded := readiness(res.Checks); verdict {
	case "unready":
		res.Status, status = verdict, http.StatusServiceUnavailable
	case "degraded":
		res.Status, res.Degraded = verdict, degraded
	}
	for name, state := range res.Checks {
		if state != "ok" {
			s.log.WarnContext(parent, "not ready", "check", name, "state", state, "status", res.Status)
		}
	}
	if s.cfg.ReadyEndpoints != nil {
		res.Endpoints = s.cfg.ReadyEndpoints()
	}
	if s.cfg.ReadySigners != nil {
		res.Signers = s.cfg.ReadySigners()
	}
	return &readyAnswer{status: status, body: res}
}

// readiness judges the checks' states. A check named "<kind>:<network>" (rpc:eip155:8453,
// indexer:eip155:8453) is one network's: while another network passes all of its own, a network
// that fails one is degraded, not the process: one provider's outage must not take every
// network's service away. A check of no network (postgres), or every network failing, is unready.
func readiness(checks map[string]string) (verdict string, degraded []string) {
	networks := map[string]bool{} // network: all its checks passed
	unready := false
	for name, state := range checks {
		ok := state == "ok"
		_, network, scoped := strings.Cut(name, ":")
		if !scoped {
			unready = unready || !ok
			continue
		}
		if passed, seen := networks[network]; !seen || passed {
			networks[network] = ok
		}
	}
	serving := 0
	for network, passed := range networks {
		if passed {
			serving++
		} else {
			degraded = append(degraded, network)
		}
	}
	sort.Strings(degraded)
	switch {
	case unready || (len(networks) > 0 && serving == 0):
		return "unready", nil
	case len(degraded) > 0:
		return "degraded", degraded
	}
	return "ready", nil
}
