package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// runHealthcheck is `facilitator healthcheck`: one GET of a running facilitator's /healthz,
// exit 0 on 200. The serve image is the binary alone (no shell, no curl), so its HEALTHCHECK
// asks the binary itself.
func runHealthcheck(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "the /healthz to ask (default: http://127.0.0.1:<port of FACILITATOR_LISTEN, else 4021>/healthz)")
	timeout := fs.Duration("timeout", 3*time.Second, "bound on the request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArguments(fs); err != nil {
		return err
	}
	if *url == "" {
		*url = localHealthz(getenv("FACILITATOR_LISTEN"))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", *url, res.Status)
	}
	return nil
}

// localHealthz is /healthz on the loopback at serve's port: the probe runs in the server's own
// container, where serve may listen on 0.0.0.0 (not an address to dial).
func localHealthz(listen string) string {
	port := "4021"
	if _, p, err := net.SplitHostPort(listen); err == nil && p != "" {
		port = p
	}
	return "http://" + net.JoinHostPort("127.0.0.1", port) + "/healthz"
}
