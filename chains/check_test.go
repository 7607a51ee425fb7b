package chains_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/chains"
	"github.com/x402-facilitator/x402-facilitator/devchain"
	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// TestAnvilPresetDomain runs the start-up checks against Circle's real FiatTokenV2_2 on anvil: the
// anvil preset passes as it is; a wrong name, a wrong version, a wrong chain or a wrong address
// is refused with a message naming the network, the token and what differs.
func TestAnvilPresetDomain(t *testing.T) {
	chain := stacktest.NewChain(t, devchain.Options{})
	p, err := chains.Lookup("anvil")
	if err != nil {
		t.Fatal(err)
	}
	if chain.USDC.Address != p.USDC.Address || chain.ChainID != p.ChainID {
		t.Fatalf("devchain deployed USDC at %s on chain %d; the anvil preset says %s on %d",
			chain.USDC.Address.Hex(), chain.ChainID, p.USDC.Address.Hex(), p.ChainID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &ethrpc.Reader{Chain: chain.RPC, Timeout: 5 * time.Second}
	n := facilitator.Network{ID: p.CAIP2(), ChainID: p.ChainID, V1Name: p.V1Name, Tokens: []facilitator.Token{p.USDC}, Finality: p.Finality}

	genesis, err := chains.CheckChain(ctx, chain.RPC, n)
	if err != nil || genesis == (common.Hash{}) {
		t.Fatalf("the anvil preset's chain check: %s, %v", genesis, err)
	}
	d, err := chains.ReadDomain(ctx, r, p.USDC.Address)
	if err != nil || d.Name == nil || *d.Name != "USD Coin" || d.Version == nil || *d.Version != "2" || d.Separator == nil ||
		*d.Separator != eip3009.DomainSeparator("USD Coin", "2", p.ChainID, p.USDC.Address) || d.Decimals == nil || *d.Decimals != 6 {
		t.Fatalf("the token's domain as read: %+v, %v", d, err)
	}
	if err := chains.CheckToken(ctx, r, n, p.USDC); err != nil {
		t.Fatalf("the anvil preset's token check: %v", err)
	}

	addr := p.USDC.Address.Hex()
	wrongChain := n
	wrongChain.ChainID = 8453
	for name, c := range map[string]struct {
		n    facilitator.Network
		tok  facilitator.Token
		want []string
	}{
		"name":    {n, facilitator.Token{Address: p.USDC.Address, Name: "USDC", Version: "2"}, []string{"eip155:31337", addr, `name "USDC" is configured, the contract's is "USD Coin"`}},
		"version": {n, facilitator.Token{Address: p.USDC.Address, Name: "USD Coin", Version: "1"}, []string{"eip155:31337", addr, `version "1" is configured, the contract's is "2"`}},
		// The domain hashes the chain id in: the same name and version on another chain id differ.
		"chain id": {wrongChain, p.USDC, []string{addr, "DOMAIN_SEPARATOR", "chain 8453"}},
		// Decimals are not in the domain, but amounts shown in them would be off a thousandfold.
		"decimals": {n, facilitator.Token{Address: p.USDC.Address, Name: "USD Coin", Version: "2", Decimals: 9}, []string{addr, "decimals 9 is configured, the contract's decimals() is 6"}},
		// An address without a contract (a dev account) answers nothing.
		"address": {n, facilitator.Token{Address: chain.Accounts[3].Address, Name: "USD Coin", Version: "2"}, []string{chain.Accounts[3].Address.Hex(), "neither DOMAIN_SEPARATOR() nor name() and version()"}},
	} {
		t.Run("wrong "+name, func(t *testing.T) {
			err := chains.CheckToken(ctx, r, c.n, c.tok)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
		})
	}

	// A network that names another chain than the node serves is refused before anything else.
	if _, err := chains.CheckChain(ctx, chain.RPC, wrongChain); err == nil || !strings.Contains(err.Error(), "serves chain 31337, not 8453") {
		t.Fatalf("chain check against another chain id: %v", err)
	}
}

// TestCompareDomain covers what anvil's FiatToken cannot show: a token without DOMAIN_SEPARATOR
// is judged by name and version, and one whose separator matches needs nothing else.
func TestCompareDomain(t *testing.T) {
	n := facilitator.Network{ID: "eip155:84532", ChainID: 84532}
	tok := facilitator.Token{Address: common.HexToAddress("0x036CbD53842c5426634e7929541eC2318f3dCF7e"), Name: "USDC", Version: "2"}
	str := func(s string) *string { return &s }
	good := eip3009.DomainSeparator(tok.Name, tok.Version, n.ChainID, tok.Address)
	other := eip3009.DomainSeparator("USD Coin", tok.Version, n.ChainID, tok.Address)
	for name, c := range map[string]struct {
		d    chains.Domain
		want string // "" accepts
	}{
		"separator only":              {chains.Domain{Separator: &good}, ""},
		"all agree":                   {chains.Domain{Name: str("USDC"), Version: str("2"), Separator: &good}, ""},
		"no separator, names agree":   {chains.Domain{Name: str("USDC"), Version: str("2")}, ""},
		"no separator, name differs":  {chains.Domain{Name: str("USD Coin"), Version: str("2")}, `name "USDC" is configured, the contract's is "USD Coin"`},
		"no separator, no version":    {chains.Domain{Name: str("USDC")}, "neither"},
		"separator differs, unread":   {chains.Domain{Separator: &other}, "DOMAIN_SEPARATOR " + other.Hex()},
		"separator and name differ":   {chains.Domain{Name: str("USD Coin"), Separator: &other}, `name "USDC" is configured, the contract's is "USD Coin"`},
		"nothing":                     {chains.Domain{}, "neither"},
		"version differs, sep agrees": {chains.Domain{Version: str("1"), Separator: &good}, ""}, // the hash is the proof
	} {
		t.Run(name, func(t *testing.T) {
			err := chains.CompareDomain(n, tok, c.d)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "eip155:84532: token "+tok.Address.Hex())):
				t.Fatalf("want an error naming the network, the token and %q, got %v", c.want, err)
			}
		})
	}
}

// failingCaller is a node that cannot be reached, failing as go-ethereum's HTTP client does: a
// *url.Error that repeats the URL, API key included.
type failingCaller struct{ url string }

func (f failingCaller) CallContext(context.Context, any, string, ...any) error {
	return &url.Error{Op: "Post", URL: f.url, Err: errors.New("connection refused")}
}

func (f failingCaller) Read(context.Context, ...*ethrpc.Read) error {
	return &url.Error{Op: "Post", URL: f.url, Err: errors.New("connection refused")}
}

// TestCheckErrorsHideURL: a node that cannot be reached fails the start with a message that does
// not carry its URL (which can hold a provider's API key).
func TestCheckErrorsHideURL(t *testing.T) {
	const secret = "https://base-mainnet.example/v2/sk_live_0123456789"
	f := failingCaller{url: secret}
	n := facilitator.Network{ID: "eip155:8453", ChainID: 8453}
	_, err1 := chains.CheckChain(context.Background(), f, n)
	err2 := chains.CheckToken(context.Background(), f, n, facilitator.Token{Name: "USD Coin", Version: "2"})
	for _, err := range []error{err1, err2} {
		if err == nil || strings.Contains(err.Error(), "sk_live") || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "eip155:8453") {
			t.Errorf("want the network and the cause without the URL, got %v", err)
		}
	}
}
