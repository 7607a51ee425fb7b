package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// checkPprofAddr accepts only a loopback address: the profiles show memory and goroutine stacks,
// which are nobody's business outside the machine.
func checkPprofAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("pprof: %q is not a loopback address", addr)
	}
	return nil
}

// pprofServer serves net/http/pprof on its own listener, apart from the API (which has no
// /debug routes). Opt-in (--pprof), for profiling under load.
type pprofServer struct {
	srv  *http.Server
	done chan struct{}
	Addr string
}

func startPprof(addr string, log *slog.Logger) (*pprofServer, error) {
	if err := checkPprofAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof: listening on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	p := &pprofServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, done: make(chan struct{}), Addr: ln.Addr().String()}
	go func() {
		defer close(p.done)
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof server stopped", "err", err)
		}
	}()
	log.Info("pprof listening", "addr", "http://"+p.Addr+"/debug/pprof/")
	return p, nil
}

func (p *pprofServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	<-p.done
}
