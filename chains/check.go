package chains

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Reader reads contract calls at the latest block; *ethrpc.Reader is the one over JSON-RPC.
type Reader interface {
	Read(ctx context.Context, reads ...*ethrpc.Read) error
}

// Caller makes one JSON-RPC call; *rpc.Client is one.
type Caller interface {
	CallContext(ctx context.Context, result any, method string, args ...any) error
}

// ErrWrongChain is CheckChain's refusal of a node that answered for another chain (or without a
// genesis block): a configuration fault, unlike a node that does not answer.
var ErrWrongChain = errors.New("the RPC serves another chain")

// CheckChain refuses a node that serves another chain than the network's (everything read from
// it would be another chain's), and returns the chain's genesis hash, which the ledger is bound to.
func CheckChain(ctx context.Context, c Caller, n facilitator.Network) (genesis common.Hash, err error) {
	var id hexutil.Uint64
	if err := ethrpc.One(ctx, c, ethrpc.ChainID(&id)); err != nil {
		return common.Hash{}, fmt.Errorf("%s: reading the chain id: %w", n.ID, withoutURL(err))
	}
	if uint64(id) != n.ChainID {
		return common.Hash{}, fmt.Errorf("%s: the RPC serves chain %d, not %d: check the network's RPC URL (or its preset)%w", n.ID, uint64(id), n.ChainID, quiet{ErrWrongChain})
	}
	var block struct {
		Hash *common.Hash `json:"hash"`
	}
	if err := ethrpc.One(ctx, c, ethrpc.Block(ethrpc.At(0), false, &block)); err != nil {
		return common.Hash{}, fmt.Errorf("%s: reading the genesis block: %w", n.ID, withoutURL(err))
	}
	if block.Hash == nil {
		return common.Hash{}, fmt.Errorf("%s: the RPC has no genesis block (a pruned or partial node?)%w", n.ID, quiet{ErrWrongChain})
	}
	return *block.Hash, nil
}

// Domain is what a token's contract says its EIP-712 domain is. A field is set when the contract
// answered it.
type Domain struct {
	Name, Version *string
	Separator     *common.Hash
	// Decimals is decimals(): not part of the domain, but what amounts are shown in.
	Decimals *uint8
}

// ReadDomain reads a token's name(), version(), DOMAIN_SEPARATOR() and decimals() in one round trip. A call
// the contract rejects (or answers with something that does not decode) leaves its field nil;
// an error means the node could not be asked.
func ReadDomain(ctx context.Context, r Reader, token common.Address) (Domain, error) {
	name := &ethrpc.Read{To: token, Data: eip3009.NameCalldata()}
	version := &ethrpc.Read{To: token, Data: eip3009.VersionCalldata()}
	sep := &ethrpc.Read{To: token, Data: eip3009.DomainSeparatorCalldata()}
	decimals := &ethrpc.Read{To: token, Data: eip3009.DecimalsCalldata()}
	if err := r.Read(ctx, name, version, sep, decimals); err != nil {
		return Domain{}, withoutURL(err)
	}
	var d Domain
	if s, ok := eip3009.DecodeString(name.Out); ok && !name.Reverted {
		d.Name = &s
	}
	if s, ok := eip3009.DecodeString(version.Out); ok && !version.Reverted {
		d.Version = &s
	}
	if h, ok := eip3009.DecodeDomainSeparator(sep.Out); ok && !sep.Reverted {
		d.Separator = &h
	}
	if n, ok := eip3009.DecodeDecimals(decimals.Out); ok && !decimals.Reverted {
		d.Decimals = &n
	}
	return d, nil
}

// CheckToken reads t's EIP-712 domain from the chain and refuses it unless payments signed under
// the configured name and version would verify there (CompareDomain), and unless the configured
// decimals are the contract's (CompareDecimals).
func CheckToken(ctx context.Context, r Reader, n facilitator.Network, t facilitator.Token) error {
	d, err := ReadDomain(ctx, r, t.Address)
	if err != nil {
		return fmt.Errorf("%s: token %s: could not read its EIP-712 domain: %w", n.ID, t.Address.Hex(), err)
	}
	if err := CompareDomain(n, t, d); err != nil {
		return err
	}
	return CompareDecimals(n, t, d)
}

// CompareDecimals refuses configured decimals the contract contradicts: every amount people read
// (the console, a CSV export) would be off by powers of ten. A contract without decimals() is not
// contradicting anything.
func CompareDecimals(n facilitator.Network, t facilitator.Token, d Domain) error {
	if d.Decimals != nil && *d.Decimals != t.Decimals {
		return fmt.Errorf("%s: token %s: decimals %d is configured, the contract's decimals() is %d: set \"decimals\": %d on the token",
			n.ID, t.Address.Hex(), t.Decimals, *d.Decimals, *d.Decimals)
	}
	return nil
}

// CompareDomain decides whether the configured token matches what its contract says. The
// contract's DOMAIN_SEPARATOR is the proof: it is what the token checks signatures against, and
// it covers the name, the version, the chain id and the address at once. Only a contract without
// one is judged by name() and version(). Anything else (a difference, or nothing readable) is
// refused, naming what differs: every payment signed under the configured domain would fail.
func CompareDomain(n facilitator.Network, t facilitator.Token, d Domain) error {
	want := eip3009.DomainSeparator(t.Name, t.Version, n.ChainID, t.Address)
	if d.Separator != nil && *d.Separator == want {
		return nil
	}
	var diffs []string
	if d.Name != nil && *d.Name != t.Name {
		diffs = append(diffs, fmt.Sprintf("name %q is configured, the contract's is %q", t.Name, *d.Name))
	}
	if d.Version != nil && *d.Version != t.Version {
		diffs = append(diffs, fmt.Sprintf("version %q is configured, the contract's is %q", t.Version, *d.Version))
	}
	prefix := fmt.Sprintf("%s: token %s: ", n.ID, t.Address.Hex())
	const consequence = "; every payment signed under the configured domain would fail verification"
	switch {
	case len(diffs) > 0:
		return errors.New(prefix + "the configured EIP-712 domain is not the contract's: " + strings.Join(diffs, ", ") + consequence)
	case d.Separator != nil:
		// Name and version agree (or one is unreadable) and still the hash differs: the contract
		// hashes another chain id or address into its domain, or another domain layout.
		return fmt.Errorf("%sthe contract's DOMAIN_SEPARATOR %s is not %s, the hash of (name %q, version %q, chain %d, address %s)%s",
			prefix, d.Separator.Hex(), want.Hex(), t.Name, t.Version, n.ChainID, t.Address.Hex(), consequence)
	case d.Name != nil && d.Version != nil:
		return nil // no DOMAIN_SEPARATOR; name and version agree
	default:
		return errors.New(prefix + "the contract answers neither DOMAIN_SEPARATOR() nor name() and version(): " +
			"is this an EIP-3009 token, on this chain, at this address?")
	}
}

// quiet wraps a sentinel without adding its text: the message already says it.
type quiet struct{ err error }

func (quiet) Error() string   { return "" }
func (q quiet) Unwrap() error { return q.err }

// withoutURL drops the URL a transport error repeats: an RPC URL can hold a provider's API key.
func withoutURL(err error) error {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// CheckGenesis refuses a genesis that is not the one the preset of n's chain id knows: a node that
// answers the right chain id for another chain (a dev chain or a private network started with a
// public chain's id) would have the facilitator settle on a chain the payers never signed for.
// A chain without a preset, or whose preset knows no genesis, passes: its id is all there is.
func CheckGenesis(n facilitator.Network, genesis common.Hash) error {
	p, ok := ByChainID(n.ChainID)
	if !ok || p.Genesis == (common.Hash{}) || p.Genesis == genesis {
		return nil
	}
	return fmt.Errorf("%s: the RPC serves a chain with genesis %s, not %s's %s (chain %d): point the network's RPC at a %s node (a fork of %s keeps its genesis)%w",
		n.ID, genesis.Hex(), p.Title, p.Genesis.Hex(), p.ChainID, p.Title, p.Title, quiet{ErrWrongChain})
}
