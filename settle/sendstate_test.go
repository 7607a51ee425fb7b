package settle

import (
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The decision core, transition by transition. Each case is a settlement's state and one round's
// observation; the want is the action (and, for outcomes, the state and transaction).
func TestDecide(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	h := func(b byte) common.Hash { return common.Hash{b} }
	ours, bumped, resigned, theirs, cancel := h(1), h(2), h(3), h(9), h(8)
	blockA, blockB := h(0xa), h(0xb)
	pol := policy{finality: facilitator.Finality{Depth: 4}, retryInterval: time.Second, rebroadcastAfter: 30 * time.Second, bumpAfter: 90 * time.Second, resignMargin: 30 * time.Second}
	vb := big.NewInt(t0.Unix() + 600)
	sent := func(hash common.Hash, nonce uint64) variant {
		return variant{hash: hash, nonce: nonce, signedAt: t0, sentAt: t0, tried: t0}
	}
	open := track{state: facilitator.StateBroadcast, txNonce: 5, validBefore: vb, variants: []variant{sent(ours, 5)}}
	twoVariants := open
	twoVariants.variants = []variant{sent(ours, 5), sent(bumped, 5)}
	// A bump signed whose send waited (a later head overtook its reads): no node was asked yet.
	unsentBump := open
	unsentBump.variants = []variant{sent(ours, 5), {hash: bumped, nonce: 5, signedAt: t0}}
	batchedOpen := open
	batchedOpen.batched = true
	batchedOpen.value = big.NewInt(1000)
	// A batch's member settled again alone: its batch's variant (recovered from the ledger) and
	// its own at a new nonce.
	alone := open
	alone.txNonce = 6
	alone.value = big.NewInt(1000)
	alone.variants = []variant{sent(ours, 5), sent(resigned, 6)}
	resignedTrack := open
	resignedTrack.txNonce = 6
	resignedTrack.variants = []variant{sent(ours, 5), sent(resigned, 6)}
	mined := track{state: facilitator.StateMined, txNonce: 5, validBefore: vb, variants: []variant{sent(ours, 5)},
		mined: minedAt{tx: ours, block: 100, blockHash: blockA}}

	ok := func(r *receipt) receiptRead { return receiptRead{ok: true, r: r} }
	// callFailed is a batch's receipt that succeeded without the member's pair.
	callFailed := func(tx common.Hash, block uint64, bh common.Hash) *receipt {
		return &receipt{tx: tx, batchFailed: true, block: block, blockHash: bh}
	}
	funded, short := big.NewInt(1000), big.NewInt(999)
	success := func(tx common.Hash, block uint64, bh common.Hash) *receipt {
		return &receipt{tx: tx, success: true, transfer: true, block: block, blockHash: bh}
	}
	revert := func(tx common.Hash, block uint64, bh common.Hash) *receipt {
		return &receipt{tx: tx, block: block, blockHash: bh}
	}
	obs := func(rs map[common.Hash]receiptRead) observation {
		return observation{now: t0.Add(5 * time.Second), head: 110, receipts: rs}
	}
	pinned := func(o observation, c chainRead) observation {
		c.receiptsComplete = true
		if c.nodeHead == 0 {
			c.nodeHead = o.head
		}
		if c.atHash == (common.Hash{}) {
			c.atHash = blockA
		}
		o.chain = &c
		return o
	}
	confirmed := func(tr track, d decision) track { tr.verdict = d.verdict; return tr }

	type want struct {
		act   action
		state facilitator.State
		tx    common.Hash
	}
	cases := []struct {
		name string
		t    track
		o    observation
		want want
	}{
		{"a successful receipt resolves mined at once", open, obs(map[common.Hash]receiptRead{ours: ok(success(ours, 100, blockA))}),
			want{actResolve, facilitator.StateMined, ours}},
		{"success of one variant wins over another's revert read later", twoVariants,
			obs(map[common.Hash]receiptRead{ours: ok(success(ours, 100, blockA)), bumped: ok(revert(bumped, 101, blockB))}),
			want{actResolve, facilitator.StateMined, ours}},
		{"the re-signed variant's success wins over the old nonce's revert", resignedTrack,
			obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA)), resigned: ok(success(resigned, 101, blockB))}),
			want{actResolve, facilitator.StateMined, resigned}},
		{"a revert first asks who used the authorization", open, obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}),
			want{act: actReadAt}},
		{"a foreign transaction took a batch's nonce in a block not final yet: wait, reading at the final block", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 6}), want{act: actWait}},
		{"a foreign transaction took a batch's nonce, the authorization used: not a re-sign", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 105, time: uint64(t0.Unix()), keyNonce: 6, used: true}), want{act: actWait}},
		{"a foreign transaction took a batch's nonce, too close to validBefore: no re-sign", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 105, time: vb.Uint64() - 10, keyNonce: 6}), want{act: actWait}},
		{"a batch that reverted, in a block not final yet: wait", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 108, blockA))}), chainRead{at: 108, time: uint64(t0.Unix()), keyNonce: 6, balance: funded}),
			want{act: actWait}},
		{"a batch that reverted, read first: a verdict, not yet a re-settle", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, balance: funded}),
			want{act: actWait}},
		{"settled again alone, its own transaction unmined, the batch's reverted: wait (never a second re-settle)", alone,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA)), resigned: ok(nil)}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, balance: funded}),
			want{act: actWait}},
		{"null receipts and no flags: wait", open, obs(map[common.Hash]receiptRead{ours: ok(nil)}), want{act: actWait}},
		{"a failed read says nothing", open, obs(map[common.Hash]receiptRead{ours: {}}), want{act: actWait}},
		{"revert, the log names a foreign transaction: a verdict, not yet an outcome", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true,
				use: &authLog{tx: theirs, block: 99, blockHash: h(0x99)}}),
			want{act: actWait}},
		{"revert and the log names ours (another variant): mined by the log, never settled elsewhere", twoVariants,
			pinned(obs(map[common.Hash]receiptRead{bumped: ok(revert(bumped, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true,
				use: &authLog{tx: ours, block: 100, blockHash: blockA}}),
			want{actResolve, facilitator.StateMined, ours}},
		{"revert and the log names a transaction of our key the ledger lost: adopted, mined at once, never settled elsewhere", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true,
				use: &authLog{tx: theirs, block: 99, blockHash: h(0x99), ours: true}}),
			want{actAdopt, facilitator.StateMined, theirs}},
		{"the payer's cancel is no transaction of ours, whoever sent it", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true,
				use: &authLog{tx: cancel, canceled: true, block: 99, blockHash: h(0x99), ours: true}}),
			want{act: actWait}},
		{"used with no log in the window: wait", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true}),
			want{act: actWait}},
		{"a revert with the authorization unused while another nonce of ours may land: wait", resignedTrack,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA)), resigned: ok(nil)}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6}),
			want{act: actWait}},
		{"reads older than the revert they explain: wait and read at its block", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 105, blockB))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 5}),
			want{act: actWait}},
		{"nonce called too low: read the chain first", open, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(nil)})
			o.nonceLow = true
			return o
		}(), want{act: actReadAt}},
		{"the nonce is used but a receipt of ours is unread: wait", open,
			func() observation {
				o := pinned(obs(map[common.Hash]receiptRead{ours: {}}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 6})
				o.chain.receiptsComplete = false
				return o
			}(), want{act: actWait}},
		{"bump due, the nonce unused, but the reads are behind the highest head seen: wait", open, func() observation {
			o := pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 5})
			o.now, o.highest = t0.Add(91*time.Second), 112
			return o
		}(), want{act: actWait}},
		{"bump due but the nonce is mined: never bump, look for whose it is", open, func() observation {
			o := pinned(obs(map[common.Hash]receiptRead{ours: {}}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 6})
			o.chain.receiptsComplete = false
			o.now = t0.Add(91 * time.Second)
			return o
		}(), want{act: actWait}},
		{"a bump not sent yet, no pinned reads: read first (seed 23543)", unsentBump, obs(map[common.Hash]receiptRead{ours: ok(nil), bumped: ok(nil)}),
			want{act: actReadAt}},
		{"a bump not sent yet, the nonce unused on reads behind the highest head seen: wait", unsentBump, func() observation {
			o := pinned(obs(map[common.Hash]receiptRead{ours: ok(nil), bumped: ok(nil)}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 5})
			o.highest = 112
			return o
		}(), want{act: actWait}},
		{"a bump not sent yet, the nonce unused on reads at the highest head seen: send it", unsentBump,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(nil), bumped: ok(nil)}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 5}),
			want{act: actSend}},
		{"bump due, no pinned reads yet: read first", open, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(nil)})
			o.now = t0.Add(91 * time.Second)
			return o
		}(), want{act: actReadAt}},
		{"unmined past the rebroadcast interval: resend", open, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(nil)})
			o.now = t0.Add(31 * time.Second)
			return o
		}(), want{act: actSend}},
		{"mined, deep enough, same block: a verdict first", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(success(ours, 100, blockA))})
			o.canon = &canonRead{head: 103, hash: blockA}
			return o
		}(), want{act: actWait}},
		{"mined, not deep enough: wait", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(success(ours, 100, blockA))})
			o.canon = &canonRead{head: 102, hash: blockA}
			return o
		}(), want{act: actWait}},
		{"mined, null receipt, block still there: wait (no reopen)", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(nil)})
			o.canon = &canonRead{head: 110, hash: blockA}
			return o
		}(), want{act: actWait}},
		{"mined, receipt read failed: wait (no reopen)", mined, obs(map[common.Hash]receiptRead{ours: {}}), want{act: actWait}},
		{"mined, receipt not read, another block at its height: wait (where it went needs its receipt)", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{})
			o.canon = &canonRead{head: 110, hash: blockB}
			return o
		}(), want{act: actWait}},
		{"mined, receipt not read, its block hash unrecorded: wait", track{state: facilitator.StateMined, txNonce: 5, validBefore: vb, variants: []variant{sent(ours, 5)},
			mined: minedAt{tx: ours, block: 100}}, func() observation {
			o := obs(map[common.Hash]receiptRead{})
			o.canon = &canonRead{head: 110, hash: blockA}
			return o
		}(), want{act: actWait}},
		{"mined, the block at its height is another: a reopen verdict", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(nil)})
			o.canon = &canonRead{head: 110, hash: blockB}
			return o
		}(), want{act: actWait}},
		{"expired at a block not final yet: wait, and read there again", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 110, time: vb.Uint64(), keyNonce: 5}),
			want{act: actWait}},
		{"the use log is in a block not final yet: wait", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 109, blockA))}), chainRead{at: 109, time: uint64(t0.Unix()), keyNonce: 6, used: true,
				use: &authLog{tx: theirs, block: 109, blockHash: blockA}}),
			want{act: actWait}},
		{"closing, nonce used in a block not final yet: wait", track{state: facilitator.StateExpired, closing: true, txNonce: 5, variants: []variant{sent(ours, 5)}},
			pinned(obs(map[common.Hash]receiptRead{}), chainRead{at: 110, keyNonce: 6}), want{act: actWait}},
		{"closing, nonce still unused: resend when due", track{state: facilitator.StateExpired, closing: true, txNonce: 5, variants: []variant{sent(ours, 5)}},
			func() observation {
				o := pinned(obs(map[common.Hash]receiptRead{}), chainRead{at: 110, keyNonce: 5})
				o.now = t0.Add(31 * time.Second)
				return o
			}(), want{act: actSend}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.t, tc.o, pol)
			if d.act != tc.want.act || (tc.want.state != "" && (d.res.State != tc.want.state || d.res.TxHash != tc.want.tx)) {
				t.Fatalf("decide: %s %s %s (%s), want %s %s %s", d.act, d.res.State, d.res.TxHash, d.why, tc.want.act, tc.want.state, tc.want.tx)
			}
		})
	}

	// Terminal and reversing steps: the first read records a verdict, the same second read acts.
	terminal := []struct {
		name string
		t    track
		o    observation
		want want
	}{
		{"settled elsewhere by the log's transaction", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true,
				use: &authLog{tx: theirs, block: 99, blockHash: h(0x99)}}),
			want{actResolve, facilitator.StateSettledElsewhere, theirs}},
		{"canceled by the payer's cancel", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true,
				use: &authLog{tx: cancel, canceled: true, block: 99, blockHash: h(0x99)}}),
			want{actResolve, facilitator.StateCanceled, cancel}},
		{"a plain revert once every nonce is used", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6}),
			want{actResolve, facilitator.StateReverted, ours}},
		{"a batch that reverted, the authorization unused and valid, the payer funded: settle it again alone", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, balance: funded}),
			want{act: actResettle}},
		{"its call failed inside a batch that succeeded (no Multicall3, or short of gas), the payer funded: settle it again alone", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(callFailed(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, balance: funded}),
			want{act: actResettle}},
		{"its call failed inside the batch, the payer's balance short: its own failure", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(callFailed(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, balance: short}),
			want{actResolve, facilitator.StateReverted, ours}},
		{"a batch that reverted, too close to validBefore to settle again: failed", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: vb.Uint64() - 10, keyNonce: 6, balance: funded}),
			want{actResolve, facilitator.StateReverted, ours}},
		{"a batch that reverted, the balance not read (the reconcile job's reads): failed as before", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6}),
			want{actResolve, facilitator.StateReverted, ours}},
		{"settled again alone, and its own transaction reverted: failed, naming it", alone,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA)), resigned: ok(revert(resigned, 101, blockB))}), chainRead{at: 101, atHash: blockB, time: uint64(t0.Unix()), keyNonce: 7, balance: funded}),
			want{actResolve, facilitator.StateReverted, resigned}},
		{"expired: unused at a final block past validBefore", open,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 105, time: vb.Uint64(), keyNonce: 5}),
			want{act: actResolve, state: facilitator.StateExpired}},
		{"bump due and the nonce unused at the head: bump", open, func() observation {
			o := pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 5})
			o.now = t0.Add(91 * time.Second)
			return o
		}(), want{act: actBump}},
		{"a foreign transaction took the nonce: re-sign", open, func() observation {
			o := pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 110, time: uint64(t0.Unix()), keyNonce: 6})
			o.nonceLow = true
			return o
		}(), want{act: actResign}},
		{"a foreign transaction took a batch's nonce in a final block: re-sign as a new batch", batchedOpen,
			pinned(obs(map[common.Hash]receiptRead{ours: ok(nil)}), chainRead{at: 105, time: uint64(t0.Unix()), keyNonce: 6}),
			want{act: actResign}},
		{"mined and deep enough: final", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(success(ours, 100, blockA))})
			o.canon = &canonRead{head: 103, hash: blockA}
			return o
		}(), want{act: actFinalize}},
		{"mined, deep enough, the recorded block still at its height, receipt not read: final (the block's hash commits to the receipt)", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{})
			o.canon = &canonRead{head: 103, hash: blockA}
			return o
		}(), want{act: actFinalize}},
		{"re-included in another block: move", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(success(ours, 101, blockB))})
			return o
		}(), want{actMove, facilitator.StateMined, ours}},
		{"re-included and reverted: reopen", mined, obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 101, blockB))}), want{act: actReopen}},
		{"closing, nonce used in a final block: release", track{state: facilitator.StateExpired, closing: true, txNonce: 5, variants: []variant{sent(ours, 5)}},
			pinned(obs(map[common.Hash]receiptRead{}), chainRead{at: 105, keyNonce: 6}), want{act: actRelease}},
		{"its block reorganised away: reopen", mined, func() observation {
			o := obs(map[common.Hash]receiptRead{ours: ok(nil)})
			o.canon = &canonRead{head: 110, hash: blockB}
			return o
		}(), want{act: actReopen}},
	}
	for _, tc := range terminal {
		t.Run("twice/"+tc.name, func(t *testing.T) {
			first := decide(tc.t, tc.o, pol)
			if first.act != actWait || first.verdict == nil {
				t.Fatalf("first read: %s (%s), want a wait with a verdict", first.act, first.why)
			}
			d := decide(confirmed(tc.t, first), tc.o, pol)
			if d.act != tc.want.act || (tc.want.state != "" && (d.res.State != tc.want.state || d.res.TxHash != tc.want.tx)) {
				t.Fatalf("second read: %s %s %s (%s), want %s %s %s", d.act, d.res.State, d.res.TxHash, d.why, tc.want.act, tc.want.state, tc.want.tx)
			}
			// A verdict from another block is not a confirmation.
			other := confirmed(tc.t, first)
			v := *other.verdict
			v.atHash = h(0x77)
			other.verdict = &v
			if d := decide(other, tc.o, pol); d.act != actWait {
				t.Fatalf("a verdict read at another block confirmed it: %s", d.act)
			}
		})
	}

	// The transaction the use log names could not be read (the node did not give it): whose it
	// is is not known, so no read decides, however often the same one comes in. A node
	// withholding a transaction of ours would otherwise have it answered "not ours" (the
	// simulator's seed 16150).
	unknown := pinned(obs(map[common.Hash]receiptRead{ours: ok(revert(ours, 100, blockA))}), chainRead{at: 100, time: uint64(t0.Unix()), keyNonce: 6, used: true,
		use: &authLog{tx: theirs, block: 99, blockHash: h(0x99), senderUnknown: true}})
	tr := open
	for read := 1; read <= 3; read++ {
		d := decide(tr, unknown, pol)
		if d.act != actWait {
			t.Fatalf("read %d of a use whose sender is not known: %s %s %s (%s), want a wait", read, d.act, d.res.State, d.res.TxHash, d.why)
		}
		if d.verdict != nil {
			tr = confirmed(tr, d)
		}
	}
}

// The finality rule by the chain's tag: a mined settlement is final, and a failure's evidence
// decides, only once the answering node's finalized block (read in the same request) reaches
// it, however deep it is; a tag the node does not answer falls back to depth; a tag answer
// above the node's head, or below one already seen, is "not known", whatever the depth says.
func TestDecideFinalityTag(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	h := func(b byte) common.Hash { return common.Hash{b} }
	ours, theirs, blockA := h(1), h(9), h(0xa)
	pol := policy{finality: facilitator.Finality{Tag: facilitator.TagFinalized, Depth: 4}, retryInterval: time.Second,
		rebroadcastAfter: 30 * time.Second, bumpAfter: 90 * time.Second, resignMargin: 30 * time.Second}
	vb := big.NewInt(t0.Unix() + 600)
	sent := variant{hash: ours, nonce: 5, signedAt: t0, sentAt: t0, tried: t0}
	mined := track{state: facilitator.StateMined, txNonce: 5, validBefore: vb, variants: []variant{sent}, mined: minedAt{tx: ours, block: 100, blockHash: blockA}}
	open := track{state: facilitator.StateBroadcast, txNonce: 5, validBefore: vb, variants: []variant{sent}}
	tag := func(n uint64) facilitator.TagRead { return facilitator.TagRead{Number: n, OK: true} }

	minedObs := func(head uint64, tr facilitator.TagRead, floor uint64) observation {
		return observation{now: t0, head: head, floor: floor,
			receipts: map[common.Hash]receiptRead{ours: {ok: true, r: &receipt{tx: ours, success: true, transfer: true, block: 100, blockHash: blockA}}},
			canon:    &canonRead{head: head, hash: blockA, tag: tr}}
	}
	// Settled elsewhere, the log at block 99, read pinned at 100.
	elsewhereObs := func(nodeHead uint64, tr facilitator.TagRead, floor uint64) observation {
		return observation{now: t0, head: nodeHead, floor: floor,
			receipts: map[common.Hash]receiptRead{ours: {ok: true, r: &receipt{tx: ours, block: 100, blockHash: blockA}}},
			chain: &chainRead{at: 100, atHash: blockA, time: uint64(t0.Unix()), keyNonce: 6, nodeHead: nodeHead, used: true, tag: tr, receiptsComplete: true,
				use: &authLog{tx: theirs, block: 99, blockHash: h(0x99)}}}
	}
	twiceAct := func(tr track, o observation) (decision, decision) {
		first := decide(tr, o, pol)
		tr.verdict = first.verdict
		return first, decide(tr, o, pol)
	}
	cases := []struct {
		name  string
		t     track
		o     observation
		final bool // the second read carries the terminal step out
	}{
		{"mined, 101 deep, finalized below it: not final", mined, minedObs(200, tag(99), 0), false},
		{"mined, finalized at its block: final", mined, minedObs(200, tag(100), 0), true},
		{"mined, 2 deep (under depth 4), finalized at its block: final", mined, minedObs(101, tag(100), 0), true},
		{"mined, the node does not answer the tag: by depth", mined, minedObs(103, facilitator.TagRead{}, 0), true},
		{"mined, the node does not answer the tag, not deep enough: not final", mined, minedObs(102, facilitator.TagRead{}, 0), false},
		{"mined, the node's finalized is above its own head: not known", mined, minedObs(150, tag(151), 0), false},
		{"mined, the node's finalized went backwards: not known", mined, minedObs(200, tag(120), 121), false},
		{"settled elsewhere, finalized below the evidence: wait", open, elsewhereObs(300, tag(99), 0), false},
		{"settled elsewhere, finalized at the evidence: decided", open, elsewhereObs(101, tag(100), 0), true},
		{"settled elsewhere, finalized gone backwards: wait", open, elsewhereObs(300, tag(150), 160), false},
		{"settled elsewhere, no tag answer: by depth from the node's head", open, elsewhereObs(103, facilitator.TagRead{}, 0), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			first, second := twiceAct(tc.t, tc.o)
			if first.act != actWait {
				t.Fatalf("first read acted: %s (%s)", first.act, first.why)
			}
			acted := second.act == actFinalize || second.act == actResolve
			if acted != tc.final {
				t.Fatalf("second read: %s (%s), want final=%v", second.act, second.why, tc.final)
			}
		})
	}

	// Evidence in a block not final by the tag: the verdict says to read again at the node's
	// finalized block, never at a depth below its head.
	o := elsewhereObs(300, tag(99), 0)
	d := decide(open, o, pol)
	if d.verdict == nil || d.verdict.act != actReadAt || d.verdict.at != 99 {
		t.Fatalf("not final by the tag: %+v, want a read at the finalized block 99", d.verdict)
	}
	o = elsewhereObs(300, tag(301), 0)
	if d := decide(open, o, pol); d.act != actWait || d.verdict != nil {
		t.Fatalf("a tag above the node's head: %s %+v, want a wait with nothing to read at", d.act, d.verdict)
	}
}

// A batch's member whose call did not transfer: the reason each answer carries once decided (the
// payer's balance short is the payment's own failure, and too close to validBefore it is not
// settled again: each answered as before, batch_call_failed or, for a batch that reverted,
// transaction_failed).
func TestDecideBatchRevertedReasons(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ours, blockA := common.Hash{1}, common.Hash{0xa}
	pol := policy{finality: facilitator.Finality{Depth: 4}, retryInterval: time.Second, rebroadcastAfter: 30 * time.Second, bumpAfter: 90 * time.Second, resignMargin: 30 * time.Second}
	vb := big.NewInt(t0.Unix() + 600)
	tr := track{state: facilitator.StateBroadcast, txNonce: 5, validBefore: vb, batched: true, value: big.NewInt(1000),
		variants: []variant{{hash: ours, nonce: 5, signedAt: t0, sentAt: t0, tried: t0}}}
	for _, c := range []struct {
		name    string
		r       receipt
		time    uint64
		balance int64
		reason  string
	}{
		{"its call failed inside the batch, the balance short", receipt{tx: ours, batchFailed: true, block: 100, blockHash: blockA}, uint64(t0.Unix()), 999, facilitator.ReasonBatchCallFailed},
		{"the batch reverted, the balance short", receipt{tx: ours, block: 100, blockHash: blockA}, uint64(t0.Unix()), 0, facilitator.ReasonTransactionFailed},
		{"its call failed inside the batch, too close to validBefore", receipt{tx: ours, batchFailed: true, block: 100, blockHash: blockA}, vb.Uint64() - 10, 1000, facilitator.ReasonBatchCallFailed},
		{"the batch reverted, too close to validBefore", receipt{tx: ours, block: 100, blockHash: blockA}, vb.Uint64() - 10, 1000, facilitator.ReasonTransactionFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := c.r
			o := observation{now: t0.Add(5 * time.Second), head: 110, receipts: map[common.Hash]receiptRead{ours: {ok: true, r: &r}},
				chain: &chainRead{at: 100, atHash: blockA, time: c.time, keyNonce: 6, nodeHead: 110, receiptsComplete: true, balance: big.NewInt(c.balance)}}
			first := decide(tr, o, pol)
			second := tr
			second.verdict = first.verdict
			d := decide(second, o, pol)
			if d.act != actResolve || d.res.State != facilitator.StateReverted || d.res.ErrorReason != c.reason || d.res.TxHash != ours {
				t.Fatalf("%s %s %s %q (%s), want resolve reverted %s", d.act, d.res.State, d.res.TxHash, d.res.ErrorReason, d.why, c.reason)
			}
		})
	}
}
