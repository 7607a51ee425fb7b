package settlesim

import (
	"context"
	"math/big"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// signed is a's transferWithAuthorization signed by the key named, in the chain's token domain.
func (w *world) signed(a facilitator.Authorization, keyName string) []byte {
	cfg := w.chain.Config()
	digest := eip3009.AuthorizationDigest(eip3009.DomainSeparator(cfg.TokenName, cfg.TokenVersion, cfg.ChainID, cfg.Token), a)
	sig, err := crypto.Sign(digest[:], key(w.t, keyName))
	if err != nil {
		w.t.Fatal(err)
	}
	sig[64] += 27
	return eip3009.TransferCalldata(a, sig)
}

type simCall struct {
	To    common.Address  `json:"to"`
	Gas   *hexutil.Uint64 `json:"gas,omitempty"`
	Input hexutil.Bytes   `json:"input"`
}

type simAnswer []struct {
	Number hexutil.Uint64 `json:"number"`
	Calls  []struct {
		Status     hexutil.Uint64 `json:"status"`
		ReturnData hexutil.Bytes  `json:"returnData"`
		GasUsed    hexutil.Uint64 `json:"gasUsed"`
	} `json:"calls"`
}

func (w *world) simulate(node *Backend, calls ...simCall) (simAnswer, error) {
	var out simAnswer
	payload := map[string]any{"blockStateCalls": []map[string]any{{"calls": calls}}}
	err := node.CallContext(context.Background(), &out, "eth_simulateV1", payload, "latest")
	return out, err
}

// TestCheckSignatures: with CheckSignatures the token takes a transfer signed by its payer in the
// token's domain and refuses any other; a greedy payer's address has code, and answers verify's
// isValidSignature cheaply while its transfer burns the gas.
func TestCheckSignatures(t *testing.T) {
	w := newWorld(t, ChainConfig{CheckSignatures: true})
	w.chain.Mine()
	token := w.chain.Token()
	a := w.auth(1, 10)
	var out hexutil.Bytes
	if err := w.node.CallContext(context.Background(), &out, "eth_call", map[string]any{"to": token, "input": hexutil.Bytes(w.signed(a, "payer"))}, "latest"); err != nil {
		t.Fatalf("signed by the payer: %v", err)
	}
	err := w.node.CallContext(context.Background(), &out, "eth_call", map[string]any{"to": token, "input": hexutil.Bytes(w.signed(a, "signer"))}, "latest")
	if err == nil || !strings.Contains(err.Error(), "invalid signature") {
		t.Fatalf("signed by another key: %v, want invalid signature", err)
	}
	if err := w.node.CallContext(context.Background(), &out, "eth_call", map[string]any{"to": token, "input": hexutil.Bytes(calldata(a))}, "latest"); err == nil {
		t.Fatal("a made-up signature was taken")
	}

	var code hexutil.Bytes
	if err := w.node.CallContext(context.Background(), &code, "eth_getCode", w.payer, "latest"); err != nil || len(code) != 0 {
		t.Fatalf("the payer's code before SetGreedy: %x %v", code, err)
	}
	w.chain.SetGreedy(w.payer, true)
	if err := w.node.CallContext(context.Background(), &code, "eth_getCode", w.payer, "latest"); err != nil || len(code) == 0 {
		t.Fatalf("a greedy payer's code: %x %v", code, err)
	}
	check := append(common.CopyBytes(erc1271Magic[:]), make([]byte, 96)...)
	if err := w.node.CallContext(context.Background(), &out, "eth_call", map[string]any{"to": w.payer, "input": hexutil.Bytes(check), "gas": hexutil.Uint64(50_000)}, "latest"); err != nil ||
		len(out) < 4 || [4]byte(out[:4]) != erc1271Magic {
		t.Fatalf("isValidSignature of a greedy payer: %x %v", out, err)
	}
	if w.chain.CallSucceeds(w.chain.Head().Hash, common.Address{}, token, w.signed(a, "payer"), 0) {
		t.Fatal("a greedy payer's transfer succeeded")
	}
}

// TestSimulateV1: eth_simulateV1's calls run in order in one block after the head, each seeing
// the earlier ones' effects; a call's gas limits it; a node may not have the method.
func TestSimulateV1(t *testing.T) {
	w := newWorld(t, ChainConfig{CheckSignatures: true})
	head := w.chain.Mine()
	token := w.chain.Token()
	// x holds nothing; the payer's transfer pays it, and x's own transfer is then funded.
	x := crypto.PubkeyToAddress(key(t, "x").PublicKey)
	fund := w.auth(1, 500)
	fund.To = x
	own := facilitator.Authorization{From: x, To: w.payTo, Value: big.NewInt(400), ValidAfter: big.NewInt(0), ValidBefore: fund.ValidBefore, Nonce: [32]byte{2}}
	more := own
	more.Value, more.Nonce = big.NewInt(50), [32]byte{3}
	low := hexutil.Uint64(50_000)
	ans, err := w.simulate(w.node, simCall{To: token, Input: w.signed(own, "x")}, simCall{To: token, Input: w.signed(fund, "payer")},
		simCall{To: token, Input: w.signed(own, "x")}, simCall{To: token, Input: w.signed(more, "x"), Gas: &low},
		simCall{To: token, Input: w.signed(more, "x")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ans) != 1 || uint64(ans[0].Number) != head.Number+1 || len(ans[0].Calls) != 5 {
		t.Fatalf("answer %+v", ans)
	}
	for i, want := range []uint64{0, 1, 1, 0, 1} {
		if got := uint64(ans[0].Calls[i].Status); got != want {
			t.Fatalf("call %d: status %d, want %d (%+v)", i, got, want, ans)
		}
	}
	if w.chain.TokenBalance(x).Sign() != 0 {
		t.Fatal("a simulation changed the chain")
	}
	quiet := NewBackend(w.chain, "old", Profile{NoSimulate: true}, w.rng)
	if _, err := w.simulate(quiet, simCall{To: token, Input: w.signed(fund, "payer")}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a node without eth_simulateV1: %v", err)
	}
}
