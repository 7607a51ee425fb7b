package settlesim

import (
	"context"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
)

func pct(x *big.Int, p int64) *big.Int {
	out := new(big.Int).Mul(x, big.NewInt(p))
	return out.Div(out, big.NewInt(100))
}

// TestSendRules: eth_sendRawTransaction answers as geth's pool does, with geth's messages, which
// is what the engine's classification reads.
func TestSendRules(t *testing.T) {
	tip, feeCap := gwei, new(big.Int).Mul(big.NewInt(3), gwei)
	poor := key(t, "poor")
	tests := []struct {
		name string
		// setup runs first (the pooled transaction at nonce 0 is in place); then tx is sent.
		setup func(w *world)
		tx    func(w *world) *types.Transaction
		want  string // "" accepted
	}{
		{name: "first", tx: func(w *world) *types.Transaction { return w.sign(1, calldata(w.auth(2, 1)), tip, feeCap) }},
		{name: "same transaction again", tx: func(w *world) *types.Transaction { return w.sign(0, calldata(w.auth(1, 1)), tip, feeCap) },
			want: "already known"},
		{name: "replacement 10% up on both", tx: func(w *world) *types.Transaction {
			return w.sign(0, calldata(w.auth(1, 1)), pct(tip, 110), pct(feeCap, 110))
		}},
		{name: "replacement 9% up on the fee cap", tx: func(w *world) *types.Transaction {
			return w.sign(0, calldata(w.auth(1, 1)), pct(tip, 110), pct(feeCap, 109))
		}, want: "replacement transaction underpriced"},
		{name: "replacement with the tip unchanged", tx: func(w *world) *types.Transaction {
			return w.sign(0, calldata(w.auth(1, 1)), tip, pct(feeCap, 200))
		}, want: "replacement transaction underpriced"},
		{name: "nonce below the account's", setup: func(w *world) { w.chain.Mine() },
			tx: func(w *world) *types.Transaction {
				return w.sign(0, calldata(w.auth(3, 1)), pct(tip, 200), pct(feeCap, 200))
			},
			want: "nonce too low: next nonce 1, tx nonce 0"},
		{name: "mined transaction sent again", setup: func(w *world) { w.chain.Mine() },
			tx:   func(w *world) *types.Transaction { return w.sign(0, calldata(w.auth(1, 1)), tip, feeCap) },
			want: "nonce too low"},
		{name: "cannot pay for gas", tx: func(w *world) *types.Transaction {
			return w.signWith(poor, 1337, 0, nil, tip, feeCap, 21_000)
		}, want: "insufficient funds for gas * price + value: balance 0"},
		{name: "other chain id", tx: func(w *world) *types.Transaction {
			return w.signWith(w.signer, 1, 1, nil, tip, feeCap, 21_000)
		}, want: "invalid sender"},
		{name: "tip above fee cap", tx: func(w *world) *types.Transaction { return w.sign(1, nil, feeCap, tip) },
			want: "max priority fee per gas higher than max fee per gas"},
		{name: "gas below intrinsic", tx: func(w *world) *types.Transaction {
			return w.signWith(w.signer, 1337, 1, calldata(w.auth(4, 1)), tip, feeCap, 21_000)
		}, want: "intrinsic gas too low"},
		{name: "gas above the block's", tx: func(w *world) *types.Transaction {
			return w.signWith(w.signer, 1337, 1, nil, tip, feeCap, 31_000_000)
		}, want: "exceeds block gas limit"},
		{name: "tip below the pool's minimum", tx: func(w *world) *types.Transaction {
			return w.sign(1, nil, big.NewInt(0), feeCap)
		}, want: "transaction gas price below minimum"},
		{name: "future nonce is queued", tx: func(w *world) *types.Transaction { return w.sign(5, calldata(w.auth(5, 1)), tip, feeCap) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t, ChainConfig{})
			w.mustSend(w.sign(0, calldata(w.auth(1, 1)), tip, feeCap))
			if tt.setup != nil {
				tt.setup(w)
			}
			err := send(w.node, tt.tx(w))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantRPCError(t, err, tt.want)
		})
	}
}

// TestCumulativeFunds: the pool counts the account's other pooled transactions against its
// balance, as geth does.
func TestCumulativeFunds(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	k := key(t, "tight")
	w.chain.Fund(crypto.PubkeyToAddress(k.PublicKey), big.NewInt(21_000*3_000_000_000))
	if err := send(w.node, w.signWith(k, 1337, 0, nil, gwei, big.NewInt(3_000_000_000), 21_000)); err != nil {
		t.Fatal(err)
	}
	err := send(w.node, w.signWith(k, 1337, 1, nil, gwei, big.NewInt(3_000_000_000), 21_000))
	wantRPCError(t, err, "insufficient funds for gas * price + value")
}

// TestFeeCapBelowBaseFee: geth takes a transaction whose fee cap is below the base fee into the
// pool and mines it once the base fee falls; anvil refuses it at once.
func TestFeeCapBelowBaseFee(t *testing.T) {
	low := new(big.Int).Div(gwei, big.NewInt(2))
	t.Run("geth", func(t *testing.T) {
		w := newWorld(t, ChainConfig{})
		tx := w.sign(0, calldata(w.auth(1, 1)), big.NewInt(1), low)
		w.mustSend(tx)
		if b := w.chain.Mine(); len(b.Txs) != 0 {
			t.Fatalf("mined below the base fee: %v", b.Txs)
		}
		if info, _ := w.chain.Tx(tx.Hash()); !info.Pooled {
			t.Fatal("the transaction left the pool")
		}
		w.chain.SetNextBaseFee(big.NewInt(100))
		if b := w.chain.Mine(); len(b.Txs) != 1 || b.Txs[0] != tx.Hash() {
			t.Fatalf("block after the base fee fell: %v", b.Txs)
		}
		if r := receipt(t, w.node, tx.Hash()); r == nil || r.EffectiveGasPrice.Cmp(big.NewInt(101)) != 0 {
			t.Fatalf("receipt %+v: want an effective price of base fee + tip", r)
		}
	})
	t.Run("anvil", func(t *testing.T) {
		w := newWorld(t, ChainConfig{RejectBelowBaseFee: true})
		err := send(w.node, w.sign(0, calldata(w.auth(1, 1)), big.NewInt(1), low))
		wantRPCError(t, err, "max fee per gas less than block base fee")
	})
}

// TestMinedTransfer: a mined transferWithAuthorization reads back through a node as the engine
// reads it: the receipt, with the token's two logs, the block and its receipts, the fee charged,
// the tokens moved, and the authorization used.
func TestMinedTransfer(t *testing.T) {
	for _, overload := range []string{"v,r,s", "bytes"} {
		t.Run(overload, func(t *testing.T) {
			w := newWorld(t, ChainConfig{})
			ctx := context.Background()
			a := w.auth(7, 250)
			data := calldata(a)
			if overload == "bytes" {
				data = eip3009.TransferCalldata(a, make([]byte, 97)) // an ERC-1271 wallet's signature
			}
			tx := w.sign(0, data, gwei, new(big.Int).Mul(big.NewInt(3), gwei))
			w.mustSend(tx)
			if r := receipt(t, w.node, tx.Hash()); r != nil {
				t.Fatalf("a receipt before mining: %+v", r)
			}
			var pending hexutil.Uint64
			if err := w.node.CallContext(ctx, &pending, "eth_getTransactionCount", w.addr, "pending"); err != nil || pending != 1 {
				t.Fatalf("pending nonce %d %v, want 1", pending, err)
			}
			before := w.chain.Balance(w.addr)
			w.clock.Advance(12_000_000_000)
			mined := w.chain.Mine()

			r := receipt(t, w.node, tx.Hash())
			if r == nil || r.Status != types.ReceiptStatusSuccessful || r.BlockHash != mined.Hash || r.BlockNumber.Uint64() != mined.Number {
				t.Fatalf("receipt %+v, want success in block %d %s", r, mined.Number, mined.Hash)
			}
			if r.GasUsed < 90_000 || r.GasUsed > 100_000 {
				t.Errorf("gas used %d, want about 96,000", r.GasUsed)
			}
			if want := new(big.Int).Add(mined.BaseFee, gwei); r.EffectiveGasPrice.Cmp(want) != 0 {
				t.Errorf("effective gas price %s, want %s", r.EffectiveGasPrice, want)
			}
			fee := new(big.Int).Mul(r.EffectiveGasPrice, new(big.Int).SetUint64(r.GasUsed))
			if got := new(big.Int).Sub(before, w.chain.Balance(w.addr)); got.Cmp(fee) != 0 {
				t.Errorf("charged %s, want %s", got, fee)
			}
			if len(r.Logs) != 2 || r.Logs[0].Topics[0] != eip3009.AuthorizationUsedTopic || r.Logs[1].Topics[0] != eip3009.TransferTopic ||
				common.BytesToAddress(r.Logs[1].Topics[1][:]) != a.From || common.BytesToAddress(r.Logs[1].Topics[2][:]) != a.To ||
				new(big.Int).SetBytes(r.Logs[1].Data).Int64() != 250 || r.Logs[1].Index != 1 || r.Logs[1].TxHash != tx.Hash() {
				t.Fatalf("logs %+v", r.Logs)
			}
			if w.chain.TokenBalance(w.payTo).Int64() != 250 || w.chain.TokenBalance(w.payer).Int64() != 1_000_000-250 {
				t.Errorf("token balances %s %s", w.chain.TokenBalance(w.payTo), w.chain.TokenBalance(w.payer))
			}
			if !authorizationUsed(t, w.node, w.chain.Token(), a.From, a.Nonce, "latest") ||
				authorizationUsed(t, w.node, w.chain.Token(), a.From, a.Nonce, hexutil.EncodeUint64(mined.Number-1)) {
				t.Error("authorizationState: want used at the block, unused before it")
			}
			if !authorizationUsed(t, w.node, w.chain.Token(), a.From, a.Nonce, rpc.BlockNumberOrHashWithHash(mined.Hash, true)) {
				t.Error("authorizationState at the block by hash: want used")
			}
			if uses := w.chain.AuthorizationUses(); len(uses) != 1 || uses[0].Authorizer != a.From || uses[0].TxHash != tx.Hash() {
				t.Errorf("uses %+v", uses)
			}
			if u, ok := w.chain.AuthorizationUse(a.From, a.Nonce); !ok || u.Kind != UseTransfer || u.TxHash != tx.Hash() || u.Sender != w.addr ||
				u.BlockHash != mined.Hash || u.Value.Int64() != 250 {
				t.Errorf("use %+v %v", u, ok)
			}

			// The block, as real nodes send it: it decodes into a *types.Header whose hash is the
			// block's, and into the watcher's struct of transaction hashes.
			var h *types.Header
			if err := w.node.CallContext(ctx, &h, "eth_getBlockByNumber", "latest", false); err != nil || h == nil {
				t.Fatalf("latest block: %v", err)
			}
			if h.Hash() != mined.Hash || h.BaseFee.Cmp(mined.BaseFee) != 0 || h.Time != mined.Time {
				t.Fatalf("header hash %s, block %s", h.Hash(), mined.Hash)
			}
			var blk struct {
				Txs []common.Hash `json:"transactions"`
			}
			if err := w.node.CallContext(ctx, &blk, "eth_getBlockByHash", mined.Hash, false); err != nil || len(blk.Txs) != 1 || blk.Txs[0] != tx.Hash() {
				t.Fatalf("block txs %v %v", blk.Txs, err)
			}
			var rs []*types.Receipt
			if err := w.node.CallContext(ctx, &rs, "eth_getBlockReceipts", hexutil.EncodeUint64(mined.Number)); err != nil || len(rs) != 1 || rs[0].TxHash != tx.Hash() {
				t.Fatalf("block receipts %v %v", rs, err)
			}
			var logs []types.Log
			filter := map[string]any{"fromBlock": "0x0", "toBlock": "latest", "address": []common.Address{w.chain.Token()},
				"topics": [][]common.Hash{{eip3009.TransferTopic}, {common.BytesToHash(a.From[:])}}}
			if err := w.node.CallContext(ctx, &logs, "eth_getLogs", filter); err != nil || len(logs) != 1 || logs[0].BlockHash != mined.Hash {
				t.Fatalf("logs %+v %v", logs, err)
			}
			var full struct {
				Txs []struct {
					From common.Address `json:"from"`
					Hash common.Hash    `json:"hash"`
				} `json:"transactions"`
			}
			if err := w.node.CallContext(ctx, &full, "eth_getBlockByNumber", hexutil.EncodeUint64(mined.Number), true); err != nil ||
				len(full.Txs) != 1 || full.Txs[0].From != w.addr {
				t.Fatalf("full block %+v %v", full, err)
			}
		})
	}
}

// TestRevertedTransfer: a transfer the token refuses is mined with status 0 and no logs, costs
// its gas, and leaves the authorization unused; eth_call and eth_estimateGas say why.
func TestRevertedTransfer(t *testing.T) {
	tests := []struct {
		name   string
		auth   func(w *world) []byte
		reason string
	}{
		{"expired", func(w *world) []byte {
			a := w.auth(1, 5)
			a.ValidBefore = big.NewInt(start.Unix() + 5)
			return calldata(a)
		}, "FiatTokenV2: authorization is expired"},
		{"not yet valid", func(w *world) []byte {
			a := w.auth(1, 5)
			a.ValidAfter = big.NewInt(start.Unix() + 3000)
			return calldata(a)
		}, "FiatTokenV2: authorization is not yet valid"},
		{"balance", func(w *world) []byte { return calldata(w.auth(1, 2_000_000)) }, "ERC20: transfer amount exceeds balance"},
		{"canceled", func(w *world) []byte {
			if _, err := w.chain.Cancel(w.payer, [32]byte{1}); err != nil {
				w.t.Fatal(err)
			}
			return calldata(w.auth(1, 5))
		}, "FiatTokenV2: authorization is used or canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t, ChainConfig{})
			data := tt.auth(w)
			w.clock.Advance(60_000_000_000)
			w.chain.Mine() // calls run at the latest block's time
			token := w.chain.Token()
			var gas hexutil.Uint64
			err := w.node.CallContext(context.Background(), &gas, "eth_estimateGas", map[string]any{"from": w.addr, "to": token, "input": hexutil.Bytes(data)})
			wantRPCError(t, err, "execution reverted: "+tt.reason)
			tx := w.sign(0, data, gwei, new(big.Int).Mul(big.NewInt(3), gwei))
			w.mustSend(tx)
			w.chain.Mine()
			r := receipt(t, w.node, tx.Hash())
			if r == nil || r.Status != types.ReceiptStatusFailed || len(r.Logs) != 0 || r.GasUsed >= 90_000 {
				t.Fatalf("receipt %+v, want status 0 without logs", r)
			}
			var out hexutil.Bytes
			err = w.node.CallContext(context.Background(), &out, "eth_call", map[string]any{"to": token, "input": hexutil.Bytes(data)}, "latest")
			wantRPCError(t, err, "execution reverted: "+tt.reason)
			if tt.name == "canceled" {
				if u, ok := w.chain.AuthorizationUse(w.payer, [32]byte{1}); !ok || u.Kind != UseCancel || u.Sender != w.chain.ThirdParty() {
					t.Fatalf("use %+v %v, want the third party's cancel", u, ok)
				}
				return
			}
			if authorizationUsed(t, w.node, token, w.payer, [32]byte{1}, "latest") {
				t.Fatal("a reverted transfer used the authorization")
			}
		})
	}
}

// TestOutOfGas: a transfer signed with too little gas fails and uses all of it.
func TestOutOfGas(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	tx := w.signWith(w.signer, 1337, 0, calldata(w.auth(1, 1)), gwei, new(big.Int).Mul(big.NewInt(3), gwei), 50_000)
	w.mustSend(tx)
	w.chain.Mine()
	if r := receipt(t, w.node, tx.Hash()); r == nil || r.Status != 0 || r.GasUsed != 50_000 {
		t.Fatalf("receipt %+v", r)
	}
}

// TestMiningOrder: a block takes each sender's transactions in nonce order, the better tip
// first across senders, and stops at a nonce gap.
func TestMiningOrder(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	other := key(t, "other")
	w.chain.Fund(crypto.PubkeyToAddress(other.PublicKey), big.NewInt(1e18))
	feeCap := new(big.Int).Mul(big.NewInt(10), gwei)
	ours1 := w.sign(1, calldata(w.auth(2, 1)), new(big.Int).Mul(big.NewInt(5), gwei), feeCap) // high tip, but nonce 1
	ours0 := w.sign(0, calldata(w.auth(1, 1)), gwei, feeCap)
	gapped := w.sign(3, calldata(w.auth(3, 1)), gwei, feeCap)
	theirs := w.signWith(other, 1337, 0, nil, new(big.Int).Mul(big.NewInt(2), gwei), feeCap, 21_000)
	for _, tx := range []*types.Transaction{ours1, ours0, gapped, theirs} {
		w.mustSend(tx)
	}
	b := w.chain.Mine()
	want := []common.Hash{theirs.Hash(), ours0.Hash(), ours1.Hash()}
	if len(b.Txs) != 3 || b.Txs[0] != want[0] || b.Txs[1] != want[1] || b.Txs[2] != want[2] {
		t.Fatalf("block %v, want %v", b.Txs, want)
	}
	if info, _ := w.chain.Tx(gapped.Hash()); !info.Pooled {
		t.Fatal("the gapped transaction left the pool")
	}
}

// TestGasLimit: a block holds no more than its gas limit.
func TestGasLimit(t *testing.T) {
	w := newWorld(t, ChainConfig{GasLimit: 250_000})
	for i := range 3 {
		w.mustSend(w.sign(uint64(i), calldata(w.auth(byte(i+1), 1)), gwei, new(big.Int).Mul(big.NewInt(3), gwei)))
	}
	if b := w.chain.Mine(); len(b.Txs) != 2 {
		t.Fatalf("first block has %d transactions, want 2", len(b.Txs))
	}
	if b := w.chain.Mine(); len(b.Txs) != 1 {
		t.Fatalf("second block has %d transactions, want 1", len(b.Txs))
	}
}

// TestBaseFee: the base fee follows EIP-1559 (down 12.5% after an empty block), or stays put.
func TestBaseFee(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	if b := w.chain.Mine(); b.BaseFee.Cmp(big.NewInt(875_000_000)) != 0 {
		t.Fatalf("base fee after an empty block %s, want 875000000", b.BaseFee)
	}
	w = newWorld(t, ChainConfig{FixedBaseFee: true})
	if b := w.chain.Mine(); b.BaseFee.Cmp(gwei) != 0 {
		t.Fatalf("fixed base fee moved to %s", b.BaseFee)
	}
}

// TestForeignTakesNonce: a transaction on our key that the engine did not sign takes the nonce
// our pooled transaction holds; ours is then refused as nonce too low and never gets a receipt,
// and the oracle lists both at the nonce.
func TestForeignTakesNonce(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	ours := w.sign(0, calldata(w.auth(1, 1)), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	w.mustSend(ours)
	nonce := uint64(0)
	foreign, err := w.chain.SubmitForeign(ForeignTx{Key: w.signer, Nonce: &nonce})
	if err != nil {
		t.Fatal(err)
	}
	if b := w.chain.Mine(); len(b.Txs) != 1 || b.Txs[0] != foreign {
		t.Fatalf("block %v, want the foreign transaction", b.Txs)
	}
	wantRPCError(t, send(w.node, ours), "nonce too low")
	if r := receipt(t, w.node, ours.Hash()); r != nil {
		t.Fatalf("a receipt for the displaced transaction: %+v", r)
	}
	at := w.chain.TxsAt(w.addr, 0)
	if len(at) != 2 || at[0].Hash != ours.Hash() || at[0].Mined || at[0].Fate == "" || at[1].Hash != foreign || !at[1].Mined || at[1].Source != SourceForeign {
		t.Fatalf("transactions at nonce 0: %+v", at)
	}

	// Impersonated: the same, from an address alone.
	next := uint64(1)
	h, err := w.chain.SubmitForeign(ForeignTx{From: w.addr, Nonce: &next})
	if err != nil {
		t.Fatal(err)
	}
	w.chain.Mine()
	if info, _ := w.chain.Tx(h); !info.Mined || info.From != w.addr || w.chain.Nonce(w.addr) != 2 {
		t.Fatalf("impersonated %+v, nonce %d", info, w.chain.Nonce(w.addr))
	}
}

// TestThirdPartyTransferFirst: a third party settling the same calldata pays more and goes
// first; ours reverts, and the authorization's one use is theirs.
func TestThirdPartyTransferFirst(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	a := w.auth(1, 40)
	ours := w.sign(0, calldata(a), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	w.mustSend(ours)
	theirs, err := w.chain.ThirdPartyTransfer(calldata(a))
	if err != nil {
		t.Fatal(err)
	}
	b := w.chain.Mine()
	if len(b.Txs) != 2 || b.Txs[0] != theirs {
		t.Fatalf("block %v, want theirs first", b.Txs)
	}
	if r := receipt(t, w.node, ours.Hash()); r == nil || r.Status != 0 {
		t.Fatalf("ours %+v, want reverted", r)
	}
	if u, _ := w.chain.AuthorizationUse(a.From, a.Nonce); u.TxHash != theirs || u.Sender != w.chain.ThirdParty() {
		t.Fatalf("use %+v", u)
	}
	if txs := w.chain.AuthorizationTxs(a.From, a.Nonce); len(txs) != 2 || txs[0].Call == nil || txs[0].Call.Authorization.Value.Int64() != 40 {
		t.Fatalf("authorization txs %+v", txs)
	}
	if w.chain.TokenBalance(w.payTo).Int64() != 40 {
		t.Fatalf("paid %s, want 40 once", w.chain.TokenBalance(w.payTo))
	}
}

// TestDropPool: a dropped transaction is gone from the pool and can be sent again.
func TestDropPool(t *testing.T) {
	w := newWorld(t, ChainConfig{})
	tx := w.sign(0, calldata(w.auth(1, 1)), gwei, new(big.Int).Mul(big.NewInt(3), gwei))
	w.mustSend(tx)
	if !w.chain.DropFromPool(tx.Hash()) || len(w.chain.Pool()) != 0 {
		t.Fatal("not dropped")
	}
	if b := w.chain.Mine(); len(b.Txs) != 0 {
		t.Fatal("mined a dropped transaction")
	}
	w.mustSend(tx)
	w.mustSend(w.sign(1, calldata(w.auth(2, 1)), gwei, new(big.Int).Mul(big.NewInt(3), gwei)))
	if n := w.chain.DropPool(); n != 2 {
		t.Fatalf("dropped %d, want 2", n)
	}
	if info, _ := w.chain.Tx(tx.Hash()); info.Pooled || info.Fate != "dropped from the pool" {
		t.Fatalf("info %+v", info)
	}
}
