package settlesim

import (
	"bytes"
	"cmp"
	"math/big"
	"slices"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// The oracle's view of the chain: what is true on the canonical chain now, and everything the
// chain has seen. These read the chain directly, never through a Backend's faults.

// TxInfo is a transaction the chain has seen, and where it is now.
type TxInfo struct {
	Hash   common.Hash
	From   common.Address
	Nonce  uint64
	Source Source
	Tx     *types.Transaction
	// Call is the decoded authorization call, when the transaction is one to the token.
	Call *TokenCall
	// Batch are the decoded authorization calls of a Multicall3 aggregate3 transaction.
	Batch []TokenCall
	// Pooled: in the pool now. Mined: in a canonical block now, with Status.
	Pooled      bool
	Mined       bool
	BlockNumber uint64
	BlockHash   common.Hash
	Status      uint64
	// Fate says why a transaction left the pool unmined ("replaced by 0x…", "nonce used",
	// "dropped from the pool", "dropped by a reorganisation", "refused by the network").
	Fate string
}

func (c *Chain) infoLocked(h common.Hash) TxInfo {
	r := c.txs[h]
	info := TxInfo{Hash: h, From: r.from, Nonce: r.tx.Nonce(), Source: r.source, Tx: r.tx, Fate: r.fate}
	if to := r.tx.To(); to != nil && *to == c.cfg.Token {
		if call, ok := DecodeTokenCall(r.tx.Data()); ok {
			info.Call = &call
		}
	} else if to != nil && *to == multicall3.Address {
		calls, _ := multicall3.DecodeAggregate3Calldata(r.tx.Data())
		for _, mc := range calls {
			if call, ok := DecodeTokenCall(mc.CallData); ok && mc.Target == c.cfg.Token {
				info.Batch = append(info.Batch, call)
			}
		}
	}
	if p := c.pool[r.from][r.tx.Nonce()]; p != nil && p.tx.Hash() == h {
		info.Pooled = true
	}
	if b, i := c.canonicalInclusion(h); b != nil {
		info.Mined, info.BlockNumber, info.BlockHash, info.Status = true, b.number, b.hash, b.receipts[i].Status
		info.Fate = ""
	}
	return info
}

// canonicalInclusion is the canonical block holding h and its index there, or nil.
func (c *Chain) canonicalInclusion(h common.Hash) (*block, int) {
	for _, b := range c.included[h] {
		if b.number < uint64(len(c.canon)) && c.canon[b.number] == b {
			for i, tx := range b.txs {
				if tx.Hash() == h {
					return b, i
				}
			}
		}
	}
	return nil, 0
}

// Tx is a transaction the chain has seen.
func (c *Chain) Tx(h common.Hash) (TxInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.txs[h] == nil {
		return TxInfo{}, false
	}
	return c.infoLocked(h), true
}

// Txs lists every transaction the chain has seen (submitted, foreign, third parties'), in the
// order it first saw them.
func (c *Chain) Txs() []TxInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]TxInfo, len(c.order))
	for i, h := range c.order {
		out[i] = c.infoLocked(h)
	}
	return out
}

// TxsAt lists every transaction the chain has seen from sender with nonce, in the order seen:
// a settlement's fee-bump family, and whatever else took the nonce.
func (c *Chain) TxsAt(sender common.Address, nonce uint64) []TxInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []TxInfo
	for _, h := range c.nonces[senderNonce{sender, nonce}] {
		out = append(out, c.infoLocked(h))
	}
	return out
}

// calls are the token calls the transaction makes: its own, or its batch's.
func (t TxInfo) calls() []TokenCall {
	if t.Call != nil {
		return []TokenCall{*t.Call}
	}
	return t.Batch
}

// AuthorizationTxs lists every transaction the chain has seen that calls transferWithAuthorization
// or cancelAuthorization for (payer, nonce), by anyone, in the order seen.
func (c *Chain) AuthorizationTxs(payer common.Address, nonce [32]byte) []TxInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []TxInfo
	for _, h := range c.order {
		info := c.infoLocked(h)
		for _, call := range info.calls() {
			if call.Authorization.From == payer && call.Authorization.Nonce == nonce {
				out = append(out, info)
				break
			}
		}
	}
	return out
}

// AuthorizationUse is the canonical chain's use of (payer, nonce): at most one, which the token
// guarantees; ok is false while it is unused.
func (c *Chain) AuthorizationUse(payer common.Address, nonce [32]byte) (Use, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.head().state.auths[authKey{payer, nonce}]
	if !ok {
		return Use{}, false
	}
	return useCopy(u), true
}

// useCopy is u with nothing shared with the chain's state.
func useCopy(u Use) Use {
	u.Value = new(big.Int).Set(u.Value)
	return u
}

// AuthorizationUse is one authorization and its use on the canonical chain.
type AuthorizationUse struct {
	Authorizer common.Address
	Nonce      [32]byte
	Use
}

// AuthorizationUses lists every authorization the canonical chain has used, by authorizer then
// nonce.
func (c *Chain) AuthorizationUses() []AuthorizationUse {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []AuthorizationUse
	for k, u := range c.head().state.auths {
		out = append(out, AuthorizationUse{Authorizer: k.authorizer, Nonce: k.nonce, Use: useCopy(u)})
	}
	slices.SortFunc(out, func(a, b AuthorizationUse) int {
		if c := a.Authorizer.Cmp(b.Authorizer); c != 0 {
			return c
		}
		return bytes.Compare(a.Nonce[:], b.Nonce[:])
	})
	return out
}

// Receipt is the canonical receipt of h.
func (c *Chain) Receipt(h common.Hash) (*types.Receipt, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, i := c.canonicalInclusion(h)
	if b == nil {
		return nil, false
	}
	r := *b.receipts[i]
	r.Logs = make([]*types.Log, len(b.receipts[i].Logs))
	for j, l := range b.receipts[i].Logs {
		cp := *l
		r.Logs[j] = &cp
	}
	return &r, true
}

// Balance is addr's native balance at the head.
func (c *Chain) Balance(addr common.Address) *big.Int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return new(big.Int).Set(c.head().state.balance(addr))
}

// TokenBalance is addr's token balance at the head.
func (c *Chain) TokenBalance(addr common.Address) *big.Int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return new(big.Int).Set(c.head().state.tokens(addr))
}

// Nonce is addr's account nonce at the head (its mined transactions).
func (c *Chain) Nonce(addr common.Address) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.head().state.nonces[addr]
}

// PendingNonce is addr's next nonce counting the pool, as eth_getTransactionCount "pending".
func (c *Chain) PendingNonce(addr common.Address) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pendingNonce(addr, c.head())
}

// Balances lists every account with a native or token balance at the head, by address.
func (c *Chain) Balances() []AccountBalance {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.head().state
	seen := map[common.Address]bool{}
	for a := range st.eth {
		seen[a] = true
	}
	for a := range st.usdc {
		seen[a] = true
	}
	var out []AccountBalance
	for _, a := range sortedAddrs(seen) {
		out = append(out, AccountBalance{Address: a, Wei: new(big.Int).Set(st.balance(a)), Tokens: new(big.Int).Set(st.tokens(a)), Nonce: st.nonces[a]})
	}
	return out
}

// AccountBalance is an account's balances and nonce at the head.
type AccountBalance struct {
	Address common.Address
	Wei     *big.Int
	Tokens  *big.Int
	Nonce   uint64
}

// Reorged lists the blocks that were canonical once and are not now, in creation order.
func (c *Chain) Reorged() []Block {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Block
	for _, b := range c.blocks {
		if b.number >= uint64(len(c.canon)) || c.canon[b.number] != b {
			out = append(out, b.info())
		}
	}
	return slices.Clip(out)
}

// AuthorizationUseAt is the authorization's use in the canonical chain's state at block number.
func (c *Chain) AuthorizationUseAt(number uint64, payer common.Address, nonce [32]byte) (Use, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if number >= uint64(len(c.canon)) {
		return Use{}, false
	}
	u, ok := c.canon[number].state.auths[authKey{payer, nonce}]
	if !ok {
		return Use{}, false
	}
	return useCopy(u), true
}

// BlocksFrom lists every block the chain made numbered n or higher, canonical or reorganised
// away, in creation order: the blocks a node that is at most head − n behind could read from.
func (c *Chain) BlocksFrom(n uint64) []Block {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Block
	for _, b := range c.blocks {
		if b.number >= n {
			out = append(out, b.info())
		}
	}
	return out
}

// CallSucceeds reports whether a call from from to to with data succeeds alone on the state after
// the block with hash h (any block the chain made), as eth_call at that block would answer it,
// within gas when gas is not zero.
func (c *Chain) CallSucceeds(h common.Hash, from, to common.Address, data []byte, gas uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.byHash[h]
	if b == nil {
		return false
	}
	res := run(c.envAt(b.number, b.header.Time), b.state, from, &to, nil, data)
	return !res.reverted && (gas == 0 || res.gas <= gas)
}

// BlockLogs is the block with hash h (any block the chain made) and its logs, copies, in order.
func (c *Chain) BlockLogs(h common.Hash) (Block, []types.Log, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.byHash[h]
	if b == nil {
		return Block{}, nil, false
	}
	var out []types.Log
	for _, r := range b.receipts {
		for _, l := range r.Logs {
			out = append(out, *l)
		}
	}
	return b.info(), out, true
}

// UsesAt lists the authorizations' transfers (not cancels) in the canonical chain's state at
// block number, made in blocks from from on, in chain order (block, then transaction hash), as
// an index holds them.
func (c *Chain) UsesAt(number, from uint64) []facilitator.AuthorizationEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	if number >= uint64(len(c.canon)) {
		return nil
	}
	var out []facilitator.AuthorizationEvent
	for k, u := range c.canon[number].state.auths {
		if u.Kind == UseTransfer && u.BlockNumber >= from {
			out = append(out, facilitator.AuthorizationEvent{Authorizer: k.authorizer, Nonce: k.nonce,
				LogPosition: facilitator.LogPosition{BlockNumber: u.BlockNumber, BlockHash: c.canon[u.BlockNumber].hash, TxHash: u.TxHash, Token: c.cfg.Token}})
		}
	}
	slices.SortFunc(out, func(a, b facilitator.AuthorizationEvent) int {
		if a.BlockNumber != b.BlockNumber {
			return cmp.Compare(a.BlockNumber, b.BlockNumber)
		}
		if d := a.TxHash.Cmp(b.TxHash); d != 0 {
			return d
		}
		return bytes.Compare(a.Nonce[:], b.Nonce[:])
	})
	return out
}
