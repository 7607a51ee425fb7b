package api

import (
	"net/netip"
	"testing"
)

// TestClientIP: X-Forwarded-For is read only from a trusted peer, and then the right-most address
// outside the trusted proxies is the client; from any other peer the header is ignored.
func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("192.0.2.7/32")}
	for _, c := range []struct {
		name    string
		peer    string
		xff     []string
		trusted []netip.Prefix
		want    string
	}{
		{"no proxies trusted: header ignored", "10.0.0.1:5555", []string{"203.0.113.9"}, nil, "10.0.0.1"},
		{"untrusted peer: header ignored", "198.51.100.4:5555", []string{"203.0.113.9"}, trusted, "198.51.100.4"},
		{"untrusted peer spoofing a trusted hop", "198.51.100.4:5555", []string{"203.0.113.9, 10.0.0.2"}, trusted, "198.51.100.4"},
		{"trusted peer: the forwarded client", "10.0.0.1:5555", []string{"203.0.113.9"}, trusted, "203.0.113.9"},
		{"trusted peer, no header: the peer", "10.0.0.1:5555", nil, trusted, "10.0.0.1"},
		{"right-most untrusted, left of it spoofed", "10.0.0.1:5555", []string{"1.1.1.1, 203.0.113.9"}, trusted, "203.0.113.9"},
		{"skips trusted hops from the right", "10.0.0.1:5555", []string{"1.1.1.1, 203.0.113.9, 10.2.3.4, 192.0.2.7"}, trusted, "203.0.113.9"},
		{"several header lines are one list", "10.0.0.1:5555", []string{"1.1.1.1", "203.0.113.9, 10.2.3.4"}, trusted, "203.0.113.9"},
		{"every hop trusted: the left-most", "10.0.0.1:5555", []string{"10.9.9.9, 10.2.3.4"}, trusted, "10.9.9.9"},
		{"garbage hop: the nearest known", "10.0.0.1:5555", []string{"1.1.1.1, unknown, 10.2.3.4"}, trusted, "10.2.3.4"},
		{"hop with a port", "10.0.0.1:5555", []string{"203.0.113.9:443"}, trusted, "203.0.113.9"},
		{"IPv6 peer and hop", "[fd00::1]:5555", []string{"2001:db8::5"}, trusted, "2001:db8::5"},
		{"bracketed IPv6 hop with port", "[fd00::1]:5555", []string{"[2001:db8::5]:443"}, trusted, "2001:db8::5"},
		{"v4-mapped peer is unmapped", "[::ffff:10.0.0.1]:5555", []string{"203.0.113.9"}, trusted, "203.0.113.9"},
		{"v4-mapped hop is unmapped", "10.0.0.1:5555", []string{"::ffff:203.0.113.9"}, trusted, "203.0.113.9"},
		{"peer without a port", "10.0.0.1", []string{"203.0.113.9"}, trusted, "203.0.113.9"},
		{"peer that does not parse", "pipe", []string{"203.0.113.9"}, trusted, "pipe"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := clientIP(c.peer, c.xff, c.trusted); got != c.want {
				t.Errorf("clientIP(%q, %q) = %q, want %q", c.peer, c.xff, got, c.want)
			}
		})
	}
}
