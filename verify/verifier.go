// Package verify answers "would this authorization settle right now, for these requirements?"
// for the EVM exact scheme on EIP-3009 tokens, in the order and with the reason codes of the
// official x402 facilitator (@x402/evm 2.27), so that merchants see the same answers from us.
package verify

import (
	"context"
	"fmt"
	"log/slog"
	"math/big"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Config configures a Verifier.
type Config struct {
	// Networks are the chains served, each with a Reader in Readers under its CAIP-2 id.
	Networks []facilitator.Network
	Readers  map[string]Reader
	// EIP6492Factories are the factories a counterfactual (not yet deployed) wallet may be deployed
	// by. Empty by default: counterfactual payloads skip the signature check, so allowing a factory
	// is a trust decision.
	EIP6492Factories []common.Address
	// AssetCodeTTL is how long a token's "has code" answer is reused (default 15 min, as upstream).
	AssetCodeTTL time.Duration
	Now          func() time.Time
	Logger       *slog.Logger
}

// Verifier verifies exact-scheme EIP-3009 payments. It is safe for concurrent use.
type Verifier struct {
	networks  map[string]*facilitator.Network // by CAIP-2 id
	v1        map[string]*facilitator.Network // by v1 name
	readers   map[string]Reader
	factories map[common.Address]bool
	now       func() time.Time
	log       *slog.Logger

	codeTTL   time.Duration
	codeMu    sync.Mutex
	codeCache map[assetKey]time.Time // expiry of a positive "asset has code"

	gasMu sync.Mutex
	gas   map[assetKey]uint64 // the largest transfer estimate seen for an EOA payer, by token

	domainMu sync.Mutex
	domains  map[assetKey]tokenDomain // an accepted token's own EIP-712 name and version, as read
}

// tokenDomain is a token's EIP-712 name and version as the token answers them, and until when
// that answer is reused.
type tokenDomain struct {
	name, version string
	until         time.Time
}

type assetKey struct {
	network string
	asset   common.Address
}

// New builds a Verifier; every network must have a Reader.
func New(cfg Config) (*Verifier, error) {
	v := &Verifier{
		networks:  map[string]*facilitator.Network{},
		v1:        map[string]*facilitator.Network{},
		readers:   cfg.Readers,
		factories: map[common.Address]bool{},
		now:       cfg.Now,
		log:       cfg.Logger,
		codeTTL:   cfg.AssetCodeTTL,
		codeCache: map[assetKey]time.Time{},
		gas:       map[assetKey]uint64{},
		domains:   map[assetKey]tokenDomain{},
	}
	if v.now == nil {
		v.now = time.Now
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if v.codeTTL == 0 {
		v.codeTTL = 15 * time.Minute
	}
	for i := range cfg.Networks {
		n := &cfg.Networks[i]
		if _, ok := cfg.Readers[n.ID]; !ok {
			return nil, fmt.Errorf("verify: network %s has no chain reader", n.ID)
		}
		v.networks[n.ID] = n
		if n.V1Name != "" {
			v.v1[n.V1Name] = n
		}
	}
	for _, f := range cfg.EIP6492Factories {
		v.factories[f] = true
	}
	return v, nil
}

// Verify checks p. A failed check is an outcome (isValid false with a reason), returned with a
// nil error. The error is non-nil only when no verdict can be given: the request names a scheme or
// network we do not serve (EInvalid), or the chain could not be read (EUnavailable). Unlike the
// official facilitator, an RPC failure is never reported as a bad signature.
func (v *Verifier) Verify(ctx context.Context, p *facilitator.Payment) (facilitator.VerifyResponse, error) {
	n, err := v.route(p)
	if err != nil {
		return facilitator.VerifyResponse{}, err
	}
	vd, err := v.check(ctx, n, p, simulation{mode: simCall})
	if err != nil {
		return facilitator.VerifyResponse{}, err
	}
	if vd.reason != "" {
		return facilitator.VerifyResponse{IsValid: false, InvalidReason: vd.reason, InvalidMessage: vd.msg, Payer: p.Payer}, nil
	}
	return facilitator.VerifyResponse{IsValid: true, Payer: p.Payer}, nil
}

// Settleable is Verify for the settle path: the simulation runs from the signer that will submit
// the transaction, and proves the transfer would succeed now and sizes its gas: an eth_estimateGas
// the first time for the token, then an eth_call at the gas limit learned (simulation.hint). Gas is
// zero when the payment is invalid.
func (v *Verifier) Settleable(ctx context.Context, p *facilitator.Payment, signer common.Address) (res facilitator.VerifyResponse, gas uint64, err error) {
	res, gas, _, err = v.SettleCheck(ctx, p, signer)
	return res, gas, err
}

// SettleCheck is Settleable, and also reports whether the payer's address holds code (wallet: a
// contract wallet, or an EOA delegating with EIP-7702): the token asks that code about the
// signature, and what it does there (burn the gas a batch's other calls need) is its own.
func (v *Verifier) SettleCheck(ctx context.Context, p *facilitator.Payment, signer common.Address) (res facilitator.VerifyResponse, gas uint64, wallet bool, err error) {
	n, err := v.route(p)
	if err != nil {
		return facilitator.VerifyResponse{}, 0, false, err
	}
	vd, err := v.check(ctx, n, p, simulation{mode: simEstimate, from: signer, hint: v.gasHint(n.ID, p.Requirements.Asset), wallet: &wallet})
	if err != nil {
		return facilitator.VerifyResponse{}, 0, false, err
	}
	if vd.reason != "" {
		return facilitator.VerifyResponse{IsValid: false, InvalidReason: vd.reason, InvalidMessage: vd.msg, Payer: p.Payer}, 0, false, nil
	}
	return facilitator.VerifyResponse{IsValid: true, Payer: p.Payer}, vd.gas, wallet, nil
}

// Route returns the configured network a payment is for, or an EInvalid error.
func (v *Verifier) Route(p *facilitator.Payment) (*facilitator.Network, error) { return v.route(p) }

type simMode int

const (
	simNone simMode = iota
	simCall
	simEstimate
)

// simulation says how check proves the transfer would succeed.
type simulation struct {
	mode simMode
	from common.Address // simEstimate: the submitting signer
	// hint, when set (simEstimate), is an earlier estimate of the token's transfer for an EOA
	// payer: the simulation is then one eth_call at eip3009.GasLimit(hint), the limit the settlement is
	// signed with, instead of an eth_estimateGas (which nodes answer by running the call many
	// times, in a binary search: under load it was most of anvil's work per settlement).
	hint uint64
	// wallet, when set, is told whether the payer's address holds code, once it is read.
	wallet *bool
}

func (v *Verifier) gasHint(network string, asset common.Address) uint64 {
	v.gasMu.Lock()
	defer v.gasMu.Unlock()
	return v.gas[assetKey{network, asset}]
}

func (v *Verifier) learnGas(network string, asset common.Address, gas uint64) {
	v.gasMu.Lock()
	defer v.gasMu.Unlock()
	if k := (assetKey{network, asset}); gas > v.gas[k] {
		v.gas[k] = gas
	}
}

// route finds the network a request is for, as the official facilitator routes: by the
// requirements' scheme and network. What it cannot route, it throws on (HTTP 500); we answer 400.
func (v *Verifier) route(p *facilitator.Payment) (*facilitator.Network, error) {
	r := p.Requirements
	if r.Scheme != facilitator.SchemeExact {
		return nil, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonUnsupportedScheme,
			"scheme %q is not supported; this facilitator serves %q", clip(r.Scheme), facilitator.SchemeExact)
	}
	var n *facilitator.Network
	if p.X402Version == 1 {
		n = v.v1[r.Network]
	} else {
		n = v.networks[r.Network]
	}
	if n == nil {
		return nil, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork,
			"network %q is not served by this facilitator (see GET /supported)", clip(r.Network))
	}
	return n, nil
}

// verdict is what check finds: the first failing reason ("" when valid) with its message, and the
// transfer's gas when the simulation asked for an estimate (zero unless valid).
type verdict struct {
	reason, msg string
	gas         uint64
}

// check runs the verify steps in the official order and returns the first failing reason, or a
// valid verdict with the estimated gas when how asks for an estimate. Each step returns the
// verdict it ends on, or the zero verdict to go on.
func (v *Verifier) check(ctx context.Context, n *facilitator.Network, p *facilitator.Payment, how simulation) (verdict, error) {
	if reason, msg := checkPayload(n, p); reason != "" {
		return verdict{reason: reason, msg: msg}, nil
	}
	c, err := v.readState(ctx, n, p, how)
	if err != nil {
		return verdict{}, err
	}
	if vd, err := v.checkSignature(ctx, c); err != nil || vd.reason != "" {
		return vd, err
	}
	if vd := v.checkTerms(c); vd.reason != "" {
		return vd, nil
	}
	if how.mode == simNone {
		return verdict{}, nil
	}
	return v.checkSimulation(ctx, c)
}

// checking is one payment between check's steps: what the first batch read, and what the
// signature step found.
type checking struct {
	n      *facilitator.Network
	p      *facilitator.Payment
	how    simulation
	reader Reader

	wrapper   eip3009.Wrapped6492
	wrapped   bool
	inner     []byte       // the signature, unwrapped from ERC-6492 when wrapped
	payerCode *ethrpc.Read // the payer's code
	assetCode *ethrpc.Read // the token's code, nil when cached
	accepted  bool         // the token is one this network's configuration accepts
	sim       *ethrpc.Read // the transfer's simulation, nil when not in the first batch
	dom       tokenDomain  // the token's own EIP-712 domain, when domKnown
	domKnown  bool

	deployed       bool // the payer's address holds code
	counterfactual bool // an ERC-6492 wallet not deployed yet
	deferred       bool // an EOA's signature left to the token's check in the simulation
	digest         common.Hash
	sigChecked     bool
	sigBad         bool
}

// checkPayload is the steps that need no read: the payload type, then steps 1-3: scheme, EIP-712
// domain, network. v1 resolves the chain from the payload's own network name before looking at
// the domain, and reports an unknown name as a mismatch.
func checkPayload(n *facilitator.Network, p *facilitator.Payment) (reason, msg string) {
	if p.Permit2 {
		return facilitator.ReasonUnsupportedPayloadType, "Permit2 payloads are not supported by this facilitator; use EIP-3009 (transferWithAuthorization)"
	}
	r := p.Requirements
	if p.Scheme != facilitator.SchemeExact {
		return facilitator.ReasonInvalidScheme, ""
	}
	if p.X402Version == 1 {
		if _, ok := facilitator.V1ChainID(p.Network); !ok && p.Network != n.V1Name {
			return facilitator.ReasonNetworkMismatch, ""
		}
	}
	if r.Name == "" || r.Version == "" {
		return facilitator.ReasonMissingEIP712Domain, ""
	}
	if p.Network != r.Network {
		return facilitator.ReasonNetworkMismatch, ""
	}
	return "", ""
}

// readState reads what the later steps decide on. One round trip answers the common case: the
// payer's code (EOA or contract wallet), the token's code when not cached, and the simulation,
// which does not depend on either.
func (v *Verifier) readState(ctx context.Context, n *facilitator.Network, p *facilitator.Payment, how simulation) (*checking, error) {
	r := p.Requirements
	a := p.Authorization
	c := &checking{n: n, p: p, how: how, reader: v.readers[n.ID], inner: p.Signature}
	c.wrapper, c.wrapped = eip3009.Unwrap6492(p.Signature)
	if c.wrapped {
		c.inner = c.wrapper.Inner
	}
	c.payerCode = codeAt(a.From)
	reads := []*ethrpc.Read{c.payerCode}
	if !v.assetKnown(n.ID, r.Asset) {
		c.assetCode = codeAt(r.Asset)
		reads = append(reads, c.assetCode)
	}
	_, c.accepted = n.Token(r.Asset)
	if how.mode != simNone && c.accepted && !c.wrapped {
		c.sim = transferSimulation(r.Asset, a, c.inner, how)
		reads = append(reads, c.sim)
	}
	// The token's own domain, read with the rest until it is known (then reused like the asset's
	// code): when the payment's domain is the token's, a simulation that succeeds has had the
	// token check the signature over the very digest ecrecover would check here.
	c.dom, c.domKnown = v.tokenDomain(n.ID, r.Asset)
	var nameRead, versionRead *ethrpc.Read
	if c.sim != nil && !c.domKnown {
		nameRead, versionRead = domainReads(r.Asset)
		reads = append(reads, nameRead, versionRead)
	}
	if err := c.reader.Read(ctx, reads...); err != nil {
		return nil, v.unavailable(n, "reading payer and token state", err)
	}
	if nameRead != nil {
		if name, version, ok := decodeDomain(nameRead, versionRead); ok {
			c.dom, c.domKnown = tokenDomain{name: name, version: version}, true
			v.rememberDomain(n.ID, r.Asset, c.dom)
		}
	}
	return c, nil
}

// transferSimulation is the read that simulates an accepted token's transferWithAuthorization as
// how asks.
func transferSimulation(asset common.Address, a facilitator.Authorization, sig []byte, how simulation) *ethrpc.Read {
	sim := call(asset, eip3009.TransferCalldata(a, sig))
	// Shared with concurrent requests' simulations where the node allows (ethrpc's
	// simulations), with none that could change its outcome: a failure is always judged
	// alone. Of the state other payments change, an accepted token's transferWithAuthorization
	// rests on the payer's (its balance, its authorizations' state) and changes the payer's
	// and the payee's balances. The payee's decides only its gas, by at most PayeeSetGas (a
	// transfer to an account holding nothing sets the payee's balance slot from zero).
	sim.Simulate = true
	sim.Depends = []common.Address{a.From}
	sim.Changes = []common.Address{a.From, a.To}
	switch {
	case how.mode == simEstimate && how.hint > 0:
		sim.From, sim.GasCap = how.from, eip3009.GasLimit(how.hint)
		sim.GasDepends, sim.GasSurcharge = []common.Address{a.To}, eip3009.PayeeSetGas
	case how.mode == simEstimate:
		sim.Estimate, sim.From = true, how.from
	}
	return sim
}

// checkSignature is steps 5-7: ERC-6492 classification, factory allow-list, signature.
func (v *Verifier) checkSignature(ctx context.Context, c *checking) (verdict, error) {
	r := c.p.Requirements
	a := c.p.Authorization
	c.deployed = len(c.payerCode.Out) > 0
	if c.how.wallet != nil {
		*c.how.wallet = c.deployed
	}
	c.counterfactual = c.wrapped && !c.deployed
	if c.counterfactual && !v.factories[c.wrapper.Factory] {
		return verdict{reason: facilitator.ReasonEIP6492FactoryNotAllowed, msg: fmt.Sprintf("factory %s is not on this facilitator's allow-list", c.wrapper.Factory.Hex())}, nil
	}
	c.digest = eip3009.AuthorizationDigest(eip3009.DomainSeparator(r.Name, r.Version, c.n.ChainID, r.Asset), a)
	// An EOA's signature, when the token will check it in the simulation under the same digest, is
	// recovered here only if the payment fails on the way (ecrecover was a quarter of a verify's
	// CPU): every failing answer after this step first asks badSignature, so the reasons keep the
	// official order (the signature before recipient, window, amount, asset and simulation), and a
	// valid answer rests on the token's own check.
	c.deferred = !c.deployed && !c.wrapped && c.sim != nil && c.domKnown && c.dom.name == r.Name && c.dom.version == r.Version
	if c.counterfactual || c.deferred {
		return verdict{}, nil
	}
	if !c.deployed {
		if !recoverEOA(c.digest, c.inner, a.From) {
			return verdict{reason: facilitator.ReasonInvalidSignature}, nil
		}
		return verdict{}, nil
	}
	check := call(a.From, pack("isValidSignature", [32]byte(c.digest), c.inner))
	reads := []*ethrpc.Read{check}
	var again *ethrpc.Read
	if c.sim != nil && c.sim.Grouped && c.sim.GasCap == 0 {
		// The wallet's own isValidSignature, run in the simulation, may read any state,
		// the group's earlier transfers included: the simulation is judged again alone,
		// with this call. (A call at a gas limit is estimated alone in checkSimulation.)
		again = &ethrpc.Read{From: c.sim.From, To: c.sim.To, Data: c.sim.Data}
		reads = append(reads, again)
	}
	if err := c.reader.Read(ctx, reads...); err != nil {
		return verdict{}, v.unavailable(c.n, "calling isValidSignature on the payer's wallet", err)
	}
	if again != nil {
		c.sim = again
	}
	if check.Reverted || len(check.Out) < 4 || [4]byte(check.Out[:4]) != [4]byte(erc1271Magic) {
		return verdict{reason: facilitator.ReasonInvalidSignature}, nil
	}
	return verdict{}, nil
}

// badSignature recovers a deferred signature, once: whether it is not the payer's.
func (c *checking) badSignature() bool {
	if c.deferred && !c.sigChecked {
		c.sigChecked, c.sigBad = true, !recoverEOA(c.digest, c.inner, c.p.Authorization.From)
	}
	return c.sigBad
}

// fail is a failing verdict after the signature step: a deferred signature that is bad is
// reported first, as the official order has it.
func (c *checking) fail(reason, msg string) verdict {
	if c.badSignature() {
		return verdict{reason: facilitator.ReasonInvalidSignature}
	}
	return verdict{reason: reason, msg: msg}
}

// checkTerms is steps 8-11: recipient, validity window (6 s of margin for the settle to land),
// amount; then step 11b (v2 only upstream; we check it for v1 too, it costs nothing once cached):
// the token is deployed, and one we accept.
func (v *Verifier) checkTerms(c *checking) verdict {
	r := c.p.Requirements
	a := c.p.Authorization
	if a.To != r.PayTo {
		return c.fail(facilitator.ReasonRecipientMismatch, "")
	}
	now := big.NewInt(v.now().Unix())
	if a.ValidBefore.Cmp(new(big.Int).Add(now, big.NewInt(6))) < 0 {
		return c.fail(facilitator.ReasonValidBefore, "")
	}
	if a.ValidAfter.Cmp(now) > 0 {
		return c.fail(facilitator.ReasonValidAfter, "")
	}
	if a.Value.Cmp(r.Amount) != 0 {
		if c.p.X402Version == 1 {
			return c.fail(facilitator.ReasonAuthorizationValue, "")
		}
		return c.fail(facilitator.ReasonValueMismatch, "")
	}
	if c.assetCode != nil {
		if len(c.assetCode.Out) == 0 {
			return c.fail(facilitator.ReasonAssetNotDeployed, "")
		}
		v.rememberAsset(c.n.ID, r.Asset)
	}
	if !c.accepted {
		// Settling an arbitrary contract would let anyone spend our gas on it.
		return c.fail(facilitator.ReasonEIP3009NotSupported, fmt.Sprintf("asset %s is not an accepted EIP-3009 token on %s (see the facilitator's configuration)", r.Asset.Hex(), c.n.ID))
	}
	return verdict{}
}

// checkSimulation is step 12: the simulation, and the diagnosis of a failed one. A deferred
// signature is checked here, before any estimate or diagnosis: a simulation that reverts in the
// end reverted here (a deferred payer is an EOA, so only a failed hinted call is estimated again).
func (v *Verifier) checkSimulation(ctx context.Context, c *checking) (verdict, error) {
	r := c.p.Requirements
	a := c.p.Authorization
	sim := c.sim
	if sim != nil && sim.Reverted && c.badSignature() {
		return verdict{reason: facilitator.ReasonInvalidSignature}, nil
	}
	if sim != nil && sim.GasCap > 0 {
		if sim.Reverted || c.deployed {
			// The call at the hinted limit proves an EOA payer's transfer fits it. It failed (the
			// authorization is bad, or the transfer needs more gas than the hint), or the payer is
			// a contract wallet, whose gas the hint says nothing about: estimate, as without a
			// hint; the estimate's verdict stands and its diagnosis follows.
			est := &ethrpc.Read{Estimate: true, From: c.how.from, To: r.Asset, Data: sim.Data}
			if err := c.reader.Read(ctx, est); err != nil {
				return verdict{}, v.unavailable(c.n, "estimating the transfer's gas", err)
			}
			sim = est
		} else {
			sim.Gas = c.how.hint
		}
	}
	if c.counterfactual || (c.wrapped && sim == nil) {
		if c.how.mode == simEstimate && c.counterfactual {
			// Settling would first have to deploy the wallet through its factory: not supported yet.
			return verdict{reason: facilitator.ReasonUnsupportedPayloadType, msg: "settling for a counterfactual (ERC-6492, not yet deployed) wallet is not supported"}, nil
		}
		var err error
		sim, err = v.simulateWrapped(ctx, c.reader, c.n, r.Asset, a, c.wrapper, c.counterfactual)
		if err != nil {
			return verdict{}, err
		}
		if c.how.mode == simEstimate && !sim.Reverted {
			est := &ethrpc.Read{Estimate: true, From: c.how.from, To: r.Asset, Data: eip3009.TransferCalldata(a, c.wrapper.Inner)}
			if err := c.reader.Read(ctx, est); err != nil {
				return verdict{}, v.unavailable(c.n, "estimating the transfer's gas", err)
			}
			sim = est
		}
	}
	if !sim.Reverted {
		if sim.Estimate && !c.deployed && !c.wrapped {
			v.learnGas(c.n.ID, r.Asset, sim.Gas)
		}
		return verdict{gas: sim.Gas}, nil
	}
	return verdict{reason: v.diagnose(ctx, c.reader, r, a), msg: sim.RevertReason}, nil
}

// simulateWrapped simulates an ERC-6492 payment. A deployed wallet is simulated like any other;
// a counterfactual one through Multicall3, deploying it first in the same call.
func (v *Verifier) simulateWrapped(ctx context.Context, reader Reader, n *facilitator.Network, asset common.Address, a facilitator.Authorization, w eip3009.Wrapped6492, counterfactual bool) (*ethrpc.Read, error) {
	if !counterfactual {
		sim := call(asset, eip3009.TransferCalldata(a, w.Inner))
		if err := reader.Read(ctx, sim); err != nil {
			return nil, v.unavailable(n, "simulating the transfer", err)
		}
		return sim, nil
	}
	agg := call(Multicall3, pack("tryAggregate", false, []aggregateCall{
		{Target: w.Factory, CallData: w.FactoryData},
		{Target: asset, CallData: eip3009.TransferCalldata(a, w.Inner)},
	}))
	if err := reader.Read(ctx, agg); err != nil {
		return nil, v.unavailable(n, "simulating the deployment and transfer", err)
	}
	if agg.Reverted {
		return agg, nil
	}
	res, err := unpackAggregate(agg.Out)
	if err != nil || len(res) != 2 {
		return &ethrpc.Read{Reverted: true, RevertReason: "Multicall3 is not available on this chain to simulate a counterfactual wallet"}, nil
	}
	if !res[1].Success {
		return &ethrpc.Read{Reverted: true, RevertReason: "transfer reverted after deploying the counterfactual wallet"}, nil
	}
	return &ethrpc.Read{}, nil
}

// diagnose names why a simulation failed, with the official facilitator's precedence. It reads in
// one batch rather than through Multicall3, which plain dev chains lack. If the diagnosis itself
// cannot be read, the simulation's failure still stands.
func (v *Verifier) diagnose(ctx context.Context, reader Reader, r facilitator.Requirements, a facilitator.Authorization) string {
	balance := call(r.Asset, eip3009.BalanceOfCalldata(a.From))
	name, version := domainReads(r.Asset)
	state := call(r.Asset, eip3009.AuthorizationStateCalldata(a.From, a.Nonce))
	if err := reader.Read(ctx, balance, name, version, state); err != nil {
		v.log.WarnContext(ctx, "diagnosing a failed simulation", "err", err)
		return facilitator.ReasonSimulationFailed
	}
	if state.Reverted {
		return facilitator.ReasonEIP3009NotSupported
	}
	if used, ok := eip3009.DecodeAuthorizationState(state.Out); ok && used {
		return facilitator.ReasonNonceAlreadyUsed
	}
	if s, ok := eip3009.DecodeString(name.Out); !name.Reverted && ok && s != r.Name {
		return facilitator.ReasonTokenNameMismatch
	}
	if s, ok := eip3009.DecodeString(version.Out); !version.Reverted && ok && s != r.Version {
		return facilitator.ReasonTokenVersionMismatch
	}
	if b, ok := eip3009.DecodeBalance(balance.Out); !balance.Reverted && ok && b.Cmp(r.Amount) < 0 {
		return facilitator.ReasonInsufficientBalance
	}
	return facilitator.ReasonSimulationFailed
}

func (v *Verifier) unavailable(n *facilitator.Network, what string, err error) error {
	return facilitator.Unavailable(facilitator.ReasonUnexpectedVerifyError,
		fmt.Sprintf("could not read %s: %s; the payment was not judged, retry", n.ID, what), err)
}

func (v *Verifier) assetKnown(network string, asset common.Address) bool {
	v.codeMu.Lock()
	defer v.codeMu.Unlock()
	exp, ok := v.codeCache[assetKey{network, asset}]
	return ok && v.now().Before(exp)
}

func (v *Verifier) rememberAsset(network string, asset common.Address) {
	v.codeMu.Lock()
	defer v.codeMu.Unlock()
	// Only configured tokens reach here after the first check, so the map stays small; still, a
	// bound keeps a flood of distinct assets from growing it.
	if len(v.codeCache) >= 4096 {
		now := v.now()
		for k, exp := range v.codeCache {
			if now.After(exp) {
				delete(v.codeCache, k)
			}
		}
		if len(v.codeCache) >= 4096 {
			return
		}
	}
	v.codeCache[assetKey{network, asset}] = v.now().Add(v.codeTTL)
}

func (v *Verifier) tokenDomain(network string, asset common.Address) (tokenDomain, bool) {
	v.domainMu.Lock()
	defer v.domainMu.Unlock()
	d, ok := v.domains[assetKey{network, asset}]
	return d, ok && v.now().Before(d.until)
}

// rememberDomain keeps an accepted token's domain for the asset code's time: a token behind a
// proxy can be upgraded to another name, and then answers under it within that time. Only
// accepted tokens are simulated, so the map is as small as the configuration.
func (v *Verifier) rememberDomain(network string, asset common.Address, d tokenDomain) {
	v.domainMu.Lock()
	defer v.domainMu.Unlock()
	d.until = v.now().Add(v.codeTTL)
	v.domains[assetKey{network, asset}] = d
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
