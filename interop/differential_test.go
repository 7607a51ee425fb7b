package interop

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/stacktest"
)

// deliberate lists the cases where we answer differently from the official facilitator on
// purpose (docs/api.md, "Deliberate differences"): ours first, theirs second.
var deliberate = map[string][2]string{
	// We normalise v to 27/28 before simulating (and settling), as the v1 packages did; the official
	// 2.27 verify accepts v = 0/1 in its signature check but then simulates with v = 0/1, which
	// USDC's ecrecover rejects.
	"v2 signature with v = 0/1": {"valid", facilitator.ReasonSimulationFailed},
	// A network we do not serve is a client error (400 invalid_network); the official facilitator
	// throws "No facilitator registered" and its example server answers 500.
	"v2 network not served": {"HTTP 400 " + facilitator.ReasonInvalidNetwork, "HTTP 500 "},
	"v2 scheme not served":  {"HTTP 400 " + facilitator.ReasonUnsupportedScheme, "HTTP 500 "},
}

type diffCase struct {
	sign signCase
	// before runs after signing and before either facilitator sees the payload.
	before func(t *testing.T, payload map[string]any)
	// edit changes the request after signing: what a confused or hostile resource server sends.
	edit func(payload, requirements map[string]any)
}

func TestDifferentialVerify(t *testing.T) {
	ctx := context.Background()
	usdc := chain.USDC.Address.Hex()
	payer := chain.Accounts[1]
	payerKey := keyHex(payer.Key.D.Bytes())
	payTo := chain.Accounts[5].Address.Hex()
	extra := func() map[string]any { return map[string]any{"name": chain.USDC.Name, "version": chain.USDC.Version} }
	v2 := func(mut ...func(map[string]any)) map[string]any {
		r := map[string]any{"scheme": "exact", "network": facilitator.CAIP2(diffChainID), "amount": "10000",
			"asset": usdc, "payTo": payTo, "maxTimeoutSeconds": 60, "extra": extra()}
		for _, m := range mut {
			m(r)
		}
		return r
	}
	v1 := func(mut ...func(map[string]any)) map[string]any {
		r := map[string]any{"scheme": "exact", "network": "base-sepolia", "maxAmountRequired": "10000",
			"resource": "http://merchant.test/paid", "description": "", "mimeType": "", "payTo": payTo,
			"maxTimeoutSeconds": 60, "asset": usdc, "extra": extra()}
		for _, m := range mut {
			m(r)
		}
		return r
	}

	// Chain fixtures the cases need.
	poor, _ := crypto.GenerateKey() // holds no USDC
	blocked := common.HexToAddress("0x000000000000000000000000000000000000b10c")
	if err := chain.USDC.Blacklist(ctx, blocked); err != nil {
		t.Fatal(err)
	}
	owner := chain.Accounts[7]
	wallet, err := chain.DeploySmartWallet(ctx, owner.Address)
	if err != nil {
		t.Fatal(err)
	}
	if err := chain.USDC.Mint(ctx, wallet, big.NewInt(1_000_000)); err != nil {
		t.Fatal(err)
	}
	notToken, err := chain.DeploySmartWallet(ctx, owner.Address) // a contract without EIP-3009
	if err != nil {
		t.Fatal(err)
	}
	nowhere := common.HexToAddress("0x00000000000000000000000000000000deadbeef").Hex()
	hourAgo := time.Now().Add(-time.Hour).Unix()
	factory := common.HexToAddress("0x0000000000000000000000000000000000fac700")

	cases := []diffCase{
		{sign: signCase{Name: "v2 valid", Requirements: v2()}},
		{sign: signCase{Name: "v2 value below amount", Requirements: v2(), AuthorizationOverrides: map[string]string{"value": "9999"}}},
		{sign: signCase{Name: "v2 value above amount", Requirements: v2(), AuthorizationOverrides: map[string]string{"value": "10001"}}},
		{sign: signCase{Name: "v2 expired", Requirements: v2(), Now: hourAgo}},
		{sign: signCase{Name: "v2 expires within 6 s", Requirements: v2(), AuthorizationOverrides: map[string]string{"validBefore": fmt.Sprint(time.Now().Unix() + 2)}}},
		{sign: signCase{Name: "v2 not valid yet", Requirements: v2(), AuthorizationOverrides: map[string]string{"validAfter": fmt.Sprint(time.Now().Unix() + 3600)}}},
		{sign: signCase{Name: "v2 recipient is not payTo", Requirements: v2(), AuthorizationOverrides: map[string]string{"to": chain.Accounts[6].Address.Hex()}}},
		{sign: signCase{Name: "v2 signed by another key", Key: keyHex(chain.Accounts[2].Key.D.Bytes()), Requirements: v2(),
			AuthorizationOverrides: map[string]string{"from": payer.Address.Hex()}}},
		{sign: signCase{Name: "v2 signed for another chain", Requirements: v2(), DomainOverrides: map[string]any{"chainId": 1}}},
		{sign: signCase{Name: "v2 requirements lack the EIP-712 version", Requirements: v2()},
			edit: func(_, r map[string]any) { r["extra"] = map[string]any{"name": chain.USDC.Name} }},
		{sign: signCase{Name: "v2 client accepted another scheme", Requirements: v2()},
			edit: func(p, _ map[string]any) { p["accepted"].(map[string]any)["scheme"] = "upto" }},
		{sign: signCase{Name: "v2 client accepted another network", Requirements: v2()},
			edit: func(p, _ map[string]any) { p["accepted"].(map[string]any)["network"] = "eip155:8453" }},
		{sign: signCase{Name: "v2 token name differs", Requirements: v2(func(r map[string]any) {
			r["extra"] = map[string]any{"name": "USDC", "version": chain.USDC.Version}
		})}},
		{sign: signCase{Name: "v2 token version differs", Requirements: v2(func(r map[string]any) {
			r["extra"] = map[string]any{"name": chain.USDC.Name, "version": "1"}
		})}},
		{sign: signCase{Name: "v2 payer has no USDC", Key: keyHex(poor.D.Bytes()), Requirements: v2()}},
		{sign: signCase{Name: "v2 nonce already used", Requirements: v2()}, before: func(t *testing.T, p map[string]any) { settleDirectly(t, p) }},
		{sign: signCase{Name: "v2 asset has no code", Requirements: v2(func(r map[string]any) { r["asset"] = nowhere })}},
		{sign: signCase{Name: "v2 asset does not implement EIP-3009", Requirements: v2(func(r map[string]any) { r["asset"] = notToken.Hex() })}},
		{sign: signCase{Name: "v2 recipient blacklisted", Requirements: v2(func(r map[string]any) { r["payTo"] = blocked.Hex() })}},
		{sign: signCase{Name: "v2 ERC-1271 wallet, owner's signature", Key: keyHex(owner.Key.D.Bytes()), Requirements: v2(),
			AuthorizationOverrides: map[string]string{"from": wallet.Hex()}}},
		{sign: signCase{Name: "v2 ERC-1271 wallet, stranger's signature", Key: keyHex(chain.Accounts[8].Key.D.Bytes()), Requirements: v2(),
			AuthorizationOverrides: map[string]string{"from": wallet.Hex()}}},
		{sign: signCase{Name: "v2 ERC-6492 counterfactual, factory not allowed", Key: keyHex(owner.Key.D.Bytes()), Requirements: v2(),
			AuthorizationOverrides: map[string]string{"from": "0x00000000000000000000000000000000c0ffee00"}},
			edit: func(p, _ map[string]any) { wrapSignature(t, p, factory) }},
		{sign: signCase{Name: "v2 ERC-6492 wrapper around a deployed wallet", Key: keyHex(owner.Key.D.Bytes()), Requirements: v2(),
			AuthorizationOverrides: map[string]string{"from": wallet.Hex()}},
			edit: func(p, _ map[string]any) { wrapSignature(t, p, factory) }},
		{sign: signCase{Name: "v2 signature with v = 0/1", Requirements: v2()},
			edit: func(p, _ map[string]any) { lowerV(t, p) }},
		{sign: signCase{Name: "v2 network not served", Requirements: v2()},
			edit: func(p, r map[string]any) {
				r["network"] = "eip155:1"
				p["accepted"].(map[string]any)["network"] = "eip155:1"
			}},
		{sign: signCase{Name: "v2 scheme not served", Requirements: v2()},
			edit: func(p, r map[string]any) { r["scheme"] = "upto"; p["accepted"].(map[string]any)["scheme"] = "upto" }},
		{sign: signCase{Name: "v1 valid", Version: 1, Requirements: v1()}},
		{sign: signCase{Name: "v1 value mismatch", Version: 1, Requirements: v1(), AuthorizationOverrides: map[string]string{"value": "1"}}},
		{sign: signCase{Name: "v1 expired", Version: 1, Requirements: v1(), Now: hourAgo}},
		{sign: signCase{Name: "v1 signed by another key", Version: 1, Key: keyHex(chain.Accounts[2].Key.D.Bytes()), Requirements: v1(),
			AuthorizationOverrides: map[string]string{"from": payer.Address.Hex()}}},
		{sign: signCase{Name: "v1 payload scheme differs", Version: 1, Requirements: v1()},
			edit: func(p, _ map[string]any) { p["scheme"] = "upto" }},
		{sign: signCase{Name: "v1 payer has no USDC", Version: 1, Key: keyHex(poor.D.Bytes()), Requirements: v1()}},
	}

	signs := make([]signCase, len(cases))
	for i := range cases {
		signs[i] = cases[i].sign
		if signs[i].Key == "" {
			signs[i].Key = payerKey
		}
		if signs[i].Version == 0 {
			signs[i].Version = 2
		}
	}
	payloads := signAll(t, signs)

	oursURL := env.NewServer(t, stacktest.ServerOptions{}).URL
	var table []string
	same, documented := 0, 0
	for i, c := range cases {
		payload := payloads[i]
		reqs := cloneMap(c.sign.Requirements)
		if c.before != nil {
			c.before(t, payload)
		}
		if c.edit != nil {
			c.edit(payload, reqs)
		}
		body, err := json.Marshal(map[string]any{"x402Version": signs[i].Version, "paymentPayload": payload, "paymentRequirements": reqs})
		if err != nil {
			t.Fatal(err)
		}
		ours, theirs := postVerify(t, oursURL, body), postVerify(t, officialURL, body)
		if theirs.Status != 200 {
			theirs.Reason = "" // their 500s carry {error}, not a reason
		}
		mark := "same"
		if want, ok := deliberate[c.sign.Name]; ok {
			if ours.String() != want[0] || theirs.String() != want[1] {
				t.Errorf("%s: documented difference changed: ours %s, official %s; documented ours %s, official %s",
					c.sign.Name, ours, theirs, want[0], want[1])
			}
			mark = "documented difference"
			documented++
		} else if ours != theirs {
			t.Errorf("%s: ours %s, official %s", c.sign.Name, ours, theirs)
			mark = "DIFFERENT"
		} else {
			same++
		}
		table = append(table, fmt.Sprintf("| %s | %s | %s | %s |", c.sign.Name, ours, theirs, mark))
	}
	t.Logf("differential /verify, %d cases: %d identical, %d documented differences\n| case | ours | official | |\n|---|---|---|---|\n%s",
		len(cases), same, documented, strings.Join(table, "\n"))
	// The table is what docs/api.md quotes; a run that cannot produce all of it must not pass.
	if same+documented != len(cases) {
		t.Fatalf("%d of %d cases disagree", len(cases)-same-documented, len(cases))
	}
}

// settleDirectly uses the payload's authorization on chain, as if someone had settled it already.
func settleDirectly(t *testing.T, payload map[string]any) {
	t.Helper()
	inner := payload["payload"].(map[string]any)
	a := inner["authorization"].(map[string]any)
	num := func(k string) *big.Int { n, _ := new(big.Int).SetString(a[k].(string), 10); return n }
	var nonce [32]byte
	copy(nonce[:], common.FromHex(a["nonce"].(string)))
	_, err := chain.USDC.TransferWithAuthorization(context.Background(), chain.Accounts[9],
		common.HexToAddress(a["from"].(string)), common.HexToAddress(a["to"].(string)),
		num("value"), num("validAfter"), num("validBefore"), nonce, common.FromHex(inner["signature"].(string)))
	if err != nil {
		t.Fatalf("settling directly: %v", err)
	}
}

// wrapSignature turns the signature into an ERC-6492 one naming factory.
func wrapSignature(t *testing.T, payload map[string]any, factory common.Address) {
	t.Helper()
	inner := payload["payload"].(map[string]any)
	addrT, _ := abi.NewType("address", "", nil)
	bytesT, _ := abi.NewType("bytes", "", nil)
	enc, err := abi.Arguments{{Type: addrT}, {Type: bytesT}, {Type: bytesT}}.Pack(factory, []byte{0x12, 0x34},
		common.FromHex(inner["signature"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	enc = append(enc, common.FromHex("0x6492649264926492649264926492649264926492649264926492649264926492")...)
	inner["signature"] = "0x" + hex.EncodeToString(enc)
}

// lowerV rewrites the signature's v from 27/28 to 0/1, as some signers produce it.
func lowerV(t *testing.T, payload map[string]any) {
	t.Helper()
	inner := payload["payload"].(map[string]any)
	sig := common.FromHex(inner["signature"].(string))
	if len(sig) != 65 || sig[64] < 27 {
		t.Fatalf("unexpected signature %x", sig)
	}
	sig[64] -= 27
	inner["signature"] = "0x" + hex.EncodeToString(sig)
}

func keyHex(d []byte) string { return "0x" + hex.EncodeToString(common.LeftPadBytes(d, 32)) }

func cloneMap(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}
