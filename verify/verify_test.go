package verify_test

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/verify"
)

const v1Name = "anvil-local"

func network(extra ...facilitator.Token) facilitator.Network {
	return facilitator.Network{
		ID:      facilitator.CAIP2(chain.ChainID),
		ChainID: chain.ChainID,
		V1Name:  v1Name,
		Tokens:  append([]facilitator.Token{{Address: chain.USDC.Address, Name: chain.USDC.Name, Version: chain.USDC.Version}}, extra...),
	}
}

func newVerifier(t testing.TB, cfg verify.Config) *verify.Verifier {
	t.Helper()
	if cfg.Networks == nil {
		cfg.Networks = []facilitator.Network{network()}
	}
	if cfg.Readers == nil {
		cfg.Readers = map[string]verify.Reader{cfg.Networks[0].ID: &ethrpc.Reader{Chain: chain.RPC, Timeout: 5 * time.Second}}
	}
	v, err := verify.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// payment is one test payment: an authorization, how it is signed, and the requirements it is
// checked against, turned into the JSON body a merchant would send.
type payment struct {
	version int
	key     *ecdsa.PrivateKey
	auth    auth
	signAs  *domain // the domain the client signs under; the token's by default
	sig     []byte  // replaces the signature when set
	// requirement fields (v2 names; v1 maps amount to maxAmountRequired)
	scheme, network, amount, asset, payTo string
	extra                                 map[string]any
	// what the client says it accepted (v2) or put in its payload (v1)
	acceptedScheme, acceptedNetwork string
}

// newPayment is a valid v2 payment of 1 USDC from a dev account (which holds USDC) to a fresh
// recipient, valid for ten minutes.
func newPayment(t testing.TB, payer int) *payment {
	key := chain.Accounts[payer].Key
	to := randomAddress(t)
	now := time.Now().Unix()
	p := &payment{
		version: 2,
		key:     key,
		auth: auth{From: crypto.PubkeyToAddress(key.PublicKey), To: to, Value: big.NewInt(1_000_000),
			ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(now + 600), Nonce: randomNonce(t)},
		scheme: "exact", network: facilitator.CAIP2(chain.ChainID), amount: "1000000",
		asset: chain.USDC.Address.Hex(), payTo: to.Hex(),
		extra: map[string]any{"name": chain.USDC.Name, "version": chain.USDC.Version},
	}
	return p
}

func (p *payment) signature(t testing.TB) []byte {
	if p.sig != nil {
		return p.sig
	}
	d := usdcDomain()
	if p.signAs != nil {
		d = *p.signAs
	}
	return sign(t, p.key, d, p.auth)
}

func (p *payment) body(t testing.TB) []byte {
	t.Helper()
	a := p.auth
	exact := map[string]any{
		"signature": hexutil(p.signature(t)),
		"authorization": map[string]any{
			"from": a.From.Hex(), "to": a.To.Hex(), "value": a.Value.String(),
			"validAfter": a.ValidAfter.String(), "validBefore": a.ValidBefore.String(), "nonce": hexutil(a.Nonce[:]),
		},
	}
	accScheme, accNetwork := p.scheme, p.network
	if p.acceptedScheme != "" {
		accScheme = p.acceptedScheme
	}
	if p.acceptedNetwork != "" {
		accNetwork = p.acceptedNetwork
	}
	var req map[string]any
	if p.version == 1 {
		req = map[string]any{
			"x402Version":    1,
			"paymentPayload": map[string]any{"x402Version": 1, "scheme": accScheme, "network": accNetwork, "payload": exact},
			"paymentRequirements": map[string]any{"scheme": p.scheme, "network": p.network, "maxAmountRequired": p.amount,
				"resource": "http://merchant.test/paid", "description": "", "mimeType": "", "payTo": p.payTo,
				"maxTimeoutSeconds": 60, "asset": p.asset, "extra": p.extra},
		}
	} else {
		reqs := map[string]any{"scheme": p.scheme, "network": p.network, "amount": p.amount, "asset": p.asset,
			"payTo": p.payTo, "maxTimeoutSeconds": 60, "extra": p.extra}
		accepted := map[string]any{}
		for k, v := range reqs {
			accepted[k] = v
		}
		accepted["scheme"], accepted["network"] = accScheme, accNetwork
		req = map[string]any{
			"x402Version": 2,
			"paymentPayload": map[string]any{"x402Version": 2, "resource": map[string]any{"url": "http://merchant.test/paid"},
				"accepted": accepted, "payload": exact},
			"paymentRequirements": reqs,
		}
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hexutil(b []byte) string { return "0x" + common.Bytes2Hex(b) }

func verifyBody(t testing.TB, v *verify.Verifier, body []byte) (facilitator.VerifyResponse, error) {
	t.Helper()
	p, err := facilitator.DecodeRequest(body)
	if err != nil {
		t.Fatalf("decoding a well-formed request: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return v.Verify(ctx, p)
}

func expect(t *testing.T, v *verify.Verifier, p *payment, reason string) {
	t.Helper()
	res, err := verifyBody(t, v, p.body(t))
	if err != nil {
		t.Fatalf("verify error: %v", err)
	}
	if reason == "" {
		if !res.IsValid {
			t.Fatalf("want valid, got %s (%s)", res.InvalidReason, res.InvalidMessage)
		}
	} else if res.IsValid || res.InvalidReason != reason {
		t.Fatalf("want invalid %s, got valid=%v reason=%s (%s)", reason, res.IsValid, res.InvalidReason, res.InvalidMessage)
	}
	if res.Payer != p.auth.From.Hex() {
		t.Fatalf("payer %q, want %q", res.Payer, p.auth.From.Hex())
	}
}

func TestVerifyReasons(t *testing.T) {
	ctx := context.Background()
	v := newVerifier(t, verify.Config{})
	now := time.Now().Unix()

	// A payer with no USDC at all (and no ETH: verify needs none).
	poor := newKey(t)
	// A recipient USDC refuses to pay: the simulation fails for a reason the diagnosis cannot name.
	blocked := randomAddress(t)
	if err := chain.USDC.Blacklist(ctx, blocked); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name   string
		edit   func(p *payment)
		reason string
	}{
		{"valid v2", func(p *payment) {}, ""},
		{"valid v1", func(p *payment) { p.version, p.network = 1, v1Name }, ""},
		{"scheme the client chose is not exact", func(p *payment) { p.acceptedScheme = "upto" }, facilitator.ReasonInvalidScheme},
		{"v1 payload scheme", func(p *payment) { p.version, p.network, p.acceptedScheme = 1, v1Name, "upto" }, facilitator.ReasonInvalidScheme},
		{"no EIP-712 version", func(p *payment) { p.extra = map[string]any{"name": chain.USDC.Name} }, facilitator.ReasonMissingEIP712Domain},
		{"no extra at all", func(p *payment) { p.extra = nil }, facilitator.ReasonMissingEIP712Domain},
		{"accepted another network", func(p *payment) { p.acceptedNetwork = "eip155:8453" }, facilitator.ReasonNetworkMismatch},
		{"v1 unknown payload network", func(p *payment) { p.version, p.network, p.acceptedNetwork = 1, v1Name, "nowhere" }, facilitator.ReasonNetworkMismatch},
		{"signed by someone else", func(p *payment) { p.key = newKey(t) }, facilitator.ReasonInvalidSignature},
		{"signature too short", func(p *payment) { p.sig = make([]byte, 64) }, facilitator.ReasonInvalidSignature},
		{"signed for another chain", func(p *payment) { d := usdcDomain(); d.ChainID = 1; p.signAs = &d }, facilitator.ReasonInvalidSignature},
		// The signature is checked before everything after it, although a valid payment's is left
		// to the token's own check in the simulation: a bad one still comes first.
		{"signed by someone else, to another recipient", func(p *payment) { p.key = newKey(t); p.payTo = randomAddress(t).Hex() }, facilitator.ReasonInvalidSignature},
		{"signed by someone else, expired", func(p *payment) { p.key = newKey(t); p.auth.ValidBefore = big.NewInt(now - 60) }, facilitator.ReasonInvalidSignature},
		{"signed by someone else, value differs", func(p *payment) { p.key = newKey(t); p.auth.Value = big.NewInt(5) }, facilitator.ReasonInvalidSignature},
		{"signed by someone else, an asset we do not accept", func(p *payment) {
			d := usdcDomain()
			d.Contract = chain.Multicall3
			p.key, p.asset, p.signAs = newKey(t), chain.Multicall3.Hex(), &d
		}, facilitator.ReasonInvalidSignature},
		// Signed under the token's real domain, while the requirements name another: the token
		// would accept the signature, the requirements' digest does not (as upstream answers).
		{"signed under the token's domain, requirements name another", func(p *payment) {
			p.extra = map[string]any{"name": "USDC", "version": chain.USDC.Version}
		}, facilitator.ReasonInvalidSignature},
		{"signed under the token's domain, requirements another version", func(p *payment) {
			p.extra = map[string]any{"name": chain.USDC.Name, "version": "1"}
		}, facilitator.ReasonInvalidSignature},
		{"v of 0/1 accepted", func(p *payment) { s := sign(t, p.key, usdcDomain(), p.auth); s[64] -= 27; p.sig = s }, ""},
		{"recipient is not payTo", func(p *payment) { p.payTo = randomAddress(t).Hex() }, facilitator.ReasonRecipientMismatch},
		{"expires within 6 s", func(p *payment) { p.auth.ValidBefore = big.NewInt(now + 3) }, facilitator.ReasonValidBefore},
		{"already expired", func(p *payment) { p.auth.ValidBefore = big.NewInt(now - 60) }, facilitator.ReasonValidBefore},
		{"not valid yet", func(p *payment) { p.auth.ValidAfter = big.NewInt(now + 600) }, facilitator.ReasonValidAfter},
		{"value above amount", func(p *payment) { p.auth.Value = big.NewInt(1_000_001) }, facilitator.ReasonValueMismatch},
		{"value below amount", func(p *payment) { p.auth.Value = big.NewInt(999_999) }, facilitator.ReasonValueMismatch},
		{"v1 value mismatch", func(p *payment) { p.version, p.network = 1, v1Name; p.auth.Value = big.NewInt(5) }, facilitator.ReasonAuthorizationValue},
		{"asset has no code", func(p *payment) {
			asset := randomAddress(t)
			d := usdcDomain()
			d.Contract = asset
			p.asset, p.signAs = asset.Hex(), &d
		}, facilitator.ReasonAssetNotDeployed},
		{"asset is a contract we do not accept", func(p *payment) {
			d := usdcDomain()
			d.Contract = chain.Multicall3
			p.asset, p.signAs = chain.Multicall3.Hex(), &d
		}, facilitator.ReasonEIP3009NotSupported},
		{"token name differs", func(p *payment) {
			d := usdcDomain()
			d.Name = "USDC"
			p.signAs, p.extra = &d, map[string]any{"name": "USDC", "version": chain.USDC.Version}
		}, facilitator.ReasonTokenNameMismatch},
		{"token version differs", func(p *payment) {
			d := usdcDomain()
			d.Version = "1"
			p.signAs, p.extra = &d, map[string]any{"name": chain.USDC.Name, "version": "1"}
		}, facilitator.ReasonTokenVersionMismatch},
		{"payer has no USDC", func(p *payment) { p.key = poor; p.auth.From = crypto.PubkeyToAddress(poor.PublicKey) }, facilitator.ReasonInsufficientBalance},
		{"recipient is blacklisted", func(p *payment) { p.auth.To = blocked; p.payTo = blocked.Hex() }, facilitator.ReasonSimulationFailed},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPayment(t, 1+i%3)
			tc.edit(p)
			expect(t, v, p, tc.reason)
		})
	}

	t.Run("nonce already used", func(t *testing.T) {
		p := newPayment(t, 4)
		sig := p.signature(t)
		a := p.auth
		if _, err := chain.USDC.TransferWithAuthorization(ctx, chain.Accounts[0], a.From, a.To, a.Value, a.ValidAfter, a.ValidBefore, a.Nonce, sig); err != nil {
			t.Fatal(err)
		}
		expect(t, v, p, facilitator.ReasonNonceAlreadyUsed)
	})

	t.Run("Permit2 payload", func(t *testing.T) {
		p := newPayment(t, 1)
		var req map[string]any
		_ = json.Unmarshal(p.body(t), &req)
		req["paymentPayload"].(map[string]any)["payload"] = map[string]any{"signature": "0x00", "permit2Authorization": map[string]any{"from": p.auth.From.Hex()}}
		body, _ := json.Marshal(req)
		res, err := verifyBody(t, v, body)
		if err != nil || res.IsValid || res.InvalidReason != facilitator.ReasonUnsupportedPayloadType {
			t.Fatalf("got %+v, %v", res, err)
		}
	})
}

// TestVerifyNotEIP3009 checks the diagnosis names a configured token that turns out not to
// implement EIP-3009: its authorizationState reverts.
func TestVerifyNotEIP3009(t *testing.T) {
	ctx := context.Background()
	notToken, err := chain.DeploySmartWallet(ctx, randomAddress(t))
	if err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t, verify.Config{Networks: []facilitator.Network{network(facilitator.Token{Address: notToken, Name: "Fake", Version: "1"})}})
	p := newPayment(t, 1)
	d := domain{Name: "Fake", Version: "1", ChainID: chain.ChainID, Contract: notToken}
	p.asset, p.signAs, p.extra = notToken.Hex(), &d, map[string]any{"name": "Fake", "version": "1"}
	expect(t, v, p, facilitator.ReasonEIP3009NotSupported)
}

// TestVerifySmartWallet covers ERC-1271 payers, and ERC-6492 wrappers both for a wallet that is
// already deployed (unwrapped and checked) and for a counterfactual one (factory allow-list).
func TestVerifySmartWallet(t *testing.T) {
	ctx := context.Background()
	owner := newKey(t)
	wallet, err := chain.DeploySmartWallet(ctx, crypto.PubkeyToAddress(owner.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.USDC.Mint(ctx, wallet, big.NewInt(10_000_000)); err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t, verify.Config{})
	walletPayment := func() *payment {
		p := newPayment(t, 1)
		p.key, p.auth.From = owner, wallet
		return p
	}

	t.Run("owner's signature", func(t *testing.T) { expect(t, v, walletPayment(), "") })
	t.Run("stranger's signature", func(t *testing.T) {
		p := walletPayment()
		p.key = newKey(t)
		expect(t, v, p, facilitator.ReasonInvalidSignature)
	})
	t.Run("6492-wrapped for a deployed wallet", func(t *testing.T) {
		p := walletPayment()
		p.sig = wrap6492(t, randomAddress(t), []byte{0xde, 0xad}, p.signature(t))
		expect(t, v, p, "")
	})
	t.Run("counterfactual wallet, factory not allowed", func(t *testing.T) {
		p := walletPayment()
		p.auth.From = randomAddress(t) // nothing deployed there
		p.sig = wrap6492(t, randomAddress(t), []byte{0x01}, sign(t, owner, usdcDomain(), p.auth))
		expect(t, v, p, facilitator.ReasonEIP6492FactoryNotAllowed)
	})
	t.Run("counterfactual wallet, allowed factory that deploys nothing", func(t *testing.T) {
		factory := randomAddress(t)
		v := newVerifier(t, verify.Config{EIP6492Factories: []common.Address{factory}})
		p := walletPayment()
		p.auth.From = randomAddress(t)
		p.sig = wrap6492(t, factory, []byte{0x01}, sign(t, owner, usdcDomain(), p.auth))
		// The signature check is skipped; the simulation is the proof, and it fails: no wallet, no USDC.
		expect(t, v, p, facilitator.ReasonInsufficientBalance)
	})
}

func wrap6492(t testing.TB, factory common.Address, calldata, inner []byte) []byte {
	t.Helper()
	addrT, _ := abi.NewType("address", "", nil)
	bytesT, _ := abi.NewType("bytes", "", nil)
	enc, err := abi.Arguments{{Type: addrT}, {Type: bytesT}, {Type: bytesT}}.Pack(factory, calldata, inner)
	if err != nil {
		t.Fatal(err)
	}
	return append(enc, common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")...)
}

// TestVerifyUnroutable: a scheme or network we do not serve is a request error, not a verdict.
func TestVerifyUnroutable(t *testing.T) {
	v := newVerifier(t, verify.Config{})
	for name, edit := range map[string]func(p *payment){
		"scheme":     func(p *payment) { p.scheme, p.acceptedScheme = "upto", "upto" },
		"network":    func(p *payment) { p.network = "eip155:1" },
		"v1 network": func(p *payment) { p.version, p.network = 1, "base" },
	} {
		t.Run(name, func(t *testing.T) {
			p := newPayment(t, 1)
			edit(p)
			_, err := verifyBody(t, v, p.body(t))
			if facilitator.ErrorCode(err) != facilitator.EInvalid {
				t.Fatalf("want EInvalid, got %v", err)
			}
		})
	}
}

// TestVerifyRPCDown: when the node cannot be reached the answer is "unavailable", never a verdict
// on the signature (the official facilitator reports invalid_exact_evm_signature here).
func TestVerifyRPCDown(t *testing.T) {
	n := network()
	v := newVerifier(t, verify.Config{Readers: map[string]verify.Reader{n.ID: failingReader{}}})
	_, err := verifyBody(t, v, newPayment(t, 1).body(t))
	if facilitator.ErrorCode(err) != facilitator.EUnavailable || facilitator.ErrorReason(err, "") != facilitator.ReasonUnexpectedVerifyError {
		t.Fatalf("want unavailable unexpected_verify_error, got %v", err)
	}
}

type failingReader struct{}

func (failingReader) Read(context.Context, ...*ethrpc.Read) error {
	return context.DeadlineExceeded
}
