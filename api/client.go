package api

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// clientIP is the address a request comes from: its TCP peer's, unless the peer is a trusted
// proxy. Behind one, it is the right-most address of X-Forwarded-For that is not a trusted proxy:
// each proxy appends the address it was reached from, so the entries right of that are our own
// proxies' and the ones left of it are whatever the client wrote. A header from any other peer
// is never read (a client could set it to anything, and spread itself over any number of rate
// limits). Addresses are unmapped (::ffff:10.0.0.1 is 10.0.0.1).
func clientIP(remoteAddr string, forwardedFor []string, trusted []netip.Prefix) string {
	peer, ok := parseHost(remoteAddr)
	if !ok {
		return remoteAddr
	}
	if !isTrusted(peer, trusted) {
		return peer.String()
	}
	var hops []string
	for _, h := range forwardedFor {
		hops = append(hops, strings.Split(h, ",")...)
	}
	nearest := peer
	for i := len(hops) - 1; i >= 0; i-- {
		hop, ok := parseHost(strings.TrimSpace(hops[i]))
		if !ok {
			// Not what a proxy of ours writes: stop at the last hop known to be true.
			return nearest.String()
		}
		if !isTrusted(hop, trusted) {
			return hop.String()
		}
		nearest = hop
	}
	return nearest.String()
}

// parseHost reads an address with or without a port ("10.0.0.1", "10.0.0.1:443", "[::1]:443").
func parseHost(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	return a.Unmap(), err == nil
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientAddress resolves the request's client address once, before routing, and carries it in
// the request's context: the rate limits, the access log and the console's login all key on it.
func (s *Server) clientAddress(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		addr := clientIP(r.RemoteAddr, r.Header.Values("X-Forwarded-For"), s.cfg.TrustedProxies)
		c.SetRequest(r.WithContext(facilitator.WithClientAddress(r.Context(), addr)))
		return next(c)
	}
}

// clientAddressOf is the request's client address as clientAddress resolved it; the TCP peer's
// when the request did not pass through it.
func clientAddressOf(r *http.Request) string {
	if a := facilitator.ClientAddressFrom(r.Context()); a != "" {
		return a
	}
	return clientIP(r.RemoteAddr, nil, nil)
}
