package notify

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strings"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Limits on what one registration may hold.
const (
	maxURLLength = 2048
	maxPayTo     = 100
)

// Reasons of registration errors (the "error" field of a 400 or 409).
const (
	ReasonInvalidWebhook      = "invalid_webhook"
	ReasonWebhookLimitReached = "webhook_limit_reached"
)

var (
	addressRE   = regexp.MustCompile(`^0[xX][0-9a-fA-F]{40}$`)
	webhookIDRE = regexp.MustCompile(`^wh_[0-9a-f]{32}$`)
)

// CreateWebhook registers rawURL, owned by owner (an API key id; "" in open mode), for the
// settlements paying one of payTo (all when empty). Which payTo an owner may ask for is the
// caller's to check. The returned facilitator.Webhook carries its secret: the only time it is shown.
func (d *Dispatcher) CreateWebhook(ctx context.Context, owner, rawURL string, payTo []string) (facilitator.Webhook, error) {
	u, err := d.checkURL(rawURL)
	if err != nil {
		return facilitator.Webhook{}, err
	}
	w := facilitator.Webhook{URL: u, PayTo: []common.Address{}, Owner: owner}
	if len(payTo) > maxPayTo {
		return facilitator.Webhook{}, facilitator.Errorf(facilitator.EInvalid, ReasonInvalidWebhook, "payTo holds at most %d addresses", maxPayTo)
	}
	seen := map[common.Address]bool{}
	for i, a := range payTo {
		if !addressRE.MatchString(a) {
			return facilitator.Webhook{}, facilitator.Errorf(facilitator.EInvalid, ReasonInvalidWebhook, "payTo[%d] must be a 0x-prefixed 20-byte hex address", i)
		}
		addr := common.HexToAddress(a)
		if !seen[addr] {
			seen[addr] = true
			w.PayTo = append(w.PayTo, addr)
		}
	}
	id, secret := make([]byte, 16), make([]byte, 32)
	if _, err := rand.Read(id); err != nil {
		return facilitator.Webhook{}, err
	}
	if _, err := rand.Read(secret); err != nil {
		return facilitator.Webhook{}, err
	}
	w.ID, w.Secret = "wh_"+hex.EncodeToString(id), hex.EncodeToString(secret)
	ok, err := d.store.InsertWebhook(ctx, &w, d.cfg.MaxWebhooks)
	if err != nil {
		return facilitator.Webhook{}, facilitator.Unavailable("webhooks_unavailable", "the ledger is unavailable, retry", err)
	}
	if !ok {
		return facilitator.Webhook{}, facilitator.Errorf(facilitator.EConflict, ReasonWebhookLimitReached,
			"%d webhooks are registered already; delete one first", d.cfg.MaxWebhooks)
	}
	d.log.InfoContext(ctx, "webhook registered", "webhook", w.ID, "api_key", owner, "host", hostOf(w.URL), "pay_to", len(w.PayTo))
	return w, nil
}

// Webhooks lists owner's enabled webhooks, without secrets.
func (d *Dispatcher) Webhooks(ctx context.Context, owner string) ([]facilitator.Webhook, error) {
	ws, err := d.store.Webhooks(ctx, owner)
	if err != nil {
		return nil, facilitator.Unavailable("webhooks_unavailable", "the ledger is unavailable, retry", err)
	}
	return ws, nil
}

// DisableWebhook stops one of owner's webhooks: nothing more is sent to it, retries included.
// Disabling a disabled webhook is not an error; another owner's is facilitator.ErrNotFound, like
// an unknown id, so that ids cannot be probed.
func (d *Dispatcher) DisableWebhook(ctx context.Context, owner, id string) error {
	if !webhookIDRE.MatchString(id) {
		// Not one of ours: answered like an unknown id rather than a malformed request, so the
		// id's format stays ours to change.
		return facilitator.ErrNotFound
	}
	err := d.store.DisableWebhook(ctx, owner, id)
	switch {
	case err == nil:
		d.log.InfoContext(ctx, "webhook disabled", "webhook", id, "api_key", owner)
		return nil
	case errors.Is(err, facilitator.ErrNotFound):
		return err
	}
	return facilitator.Unavailable("webhooks_unavailable", "the ledger is unavailable, retry", err)
}

// checkURL accepts an absolute http(s) URL with a host, without credentials (the signature is the
// receiver's proof; a password in a URL ends up in logs and listings).
func (d *Dispatcher) checkURL(raw string) (string, error) {
	bad := func(msg string) error {
		return facilitator.Errorf(facilitator.EInvalid, ReasonInvalidWebhook, "url %s", msg)
	}
	if raw == "" {
		return "", bad("is required")
	}
	if len(raw) > maxURLLength {
		return "", bad("is longer than 2048 characters")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", bad("does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", bad("must be http or https")
	}
	if u.Hostname() == "" {
		return "", bad("has no host")
	}
	if u.User != nil {
		return "", bad("must not carry credentials; verify the X402-Signature instead")
	}
	if !d.cfg.AllowPrivateTargets && !publicHost(u.Hostname()) {
		return "", bad("must point at a public address")
	}
	// What is stored and dialed is the URL re-encoded, which can be longer than what was sent.
	out := u.String()
	if len(out) > maxURLLength {
		return "", bad("is longer than 2048 characters once percent-encoded")
	}
	return out, nil
}

// publicHost reports whether a host may be public: a name (checked again at dial time, once
// resolved) or a public IP literal.
func publicHost(host string) bool {
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return false
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return publicAddr(ip)
	}
	return net.ParseIP(host) == nil // a form netip rejects (a zone, an odd spelling): refuse
}

// nonPublic are ranges IsGlobalUnicast lets through that a webhook must not reach.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT; some clouds' metadata services
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"), // 6to4 relays (deprecated)
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	// IPv6 ranges that carry or lead to an IPv4 address, where that address cannot be told for
	// sure: a webhook must not reach 127.0.0.1 or 10.0.0.1 through a translator or a tunnel.
	netip.MustParsePrefix("::/96"),          // IPv4-compatible (deprecated): ::a.b.c.d
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64: where the IPv4 sits is the network's choice
	netip.MustParsePrefix("2001::/32"),      // Teredo: the client's IPv4, obfuscated, behind a server's
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
	netip.MustParsePrefix("100::/64"),       // discard-only
	netip.MustParsePrefix("fec0::/10"),      // site-local (deprecated)
}

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96") // well-known NAT64: the IPv4 in the last 32 bits
	sixTo4 = netip.MustParsePrefix("2002::/16")    // 6to4: the IPv4 in bits 16 to 47
)

// publicAddr reports whether a webhook may reach ip: the one check made at registration (on an
// IP literal) and at dial time (on the address dialled). An IPv6 address that embeds an IPv4
// address is decided on that IPv4 address (IPv4-mapped, well-known NAT64, 6to4); the other
// transition ranges, whose IPv4 address cannot be told for sure, are refused outright.
func publicAddr(ip netip.Addr) bool {
	if ip.Zone() != "" {
		return false // scoped to an interface: never a public destination
	}
	if v4, ok := embeddedIPv4(ip); ok {
		return publicAddr(v4)
	}
	if !ip.IsGlobalUnicast() || ip.IsPrivate() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// embeddedIPv4 is the IPv4 address an IPv6 address leads to where that is certain: IPv4-mapped
// (::ffff:a.b.c.d), well-known NAT64 (64:ff9b::a.b.c.d) and 6to4 (2002:aabb:ccdd::/48).
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case ip.Is4In6(), nat64.Contains(ip):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixTo4.Contains(ip):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// hostOf is what logs say about a webhook's URL: its path and query may carry a merchant's token.
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}
