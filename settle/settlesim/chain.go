package settlesim

import (
	"crypto/ecdsa"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
)

// ChainConfig configures a Chain. Zero values take the defaults in NewChain.
type ChainConfig struct {
	ChainID uint64 // default 1337
	// Token is the EIP-3009 token's address, named TokenName/TokenVersion in its EIP-712 domain.
	Token        common.Address
	TokenName    string // default "USDC"
	TokenVersion string // default "2"
	GasLimit     uint64 // per block; default 30,000,000
	// BaseFee is the genesis base fee (default 1 gwei); with FixedBaseFee it never moves,
	// otherwise it follows EIP-1559 from each block's gas used.
	BaseFee      *big.Int
	FixedBaseFee bool
	// SuggestedTip is eth_maxPriorityFeePerGas's answer (default 1 gwei); SetSuggestedTip moves it.
	SuggestedTip *big.Int
	// PoolMinTip is the pool's minimum tip (geth's --txpool.pricelimit, default 1 wei).
	PoolMinTip *big.Int
	// RejectBelowBaseFee refuses a transaction whose fee cap is below the next block's base fee
	// at submission, as anvil does ("max fee per gas less than block base fee"). By default the
	// chain behaves as geth: the pool takes it and no block includes it until the base fee falls.
	RejectBelowBaseFee bool
	// SafeDepth and FinalizedDepth place the "safe" and "finalized" tags below the head
	// (defaults 32 and 64); Reorg never removes a finalized block.
	SafeDepth      uint64
	FinalizedDepth uint64
	// ThirdParty signs the third parties' transactions (a relayer that is not us); default a key
	// derived from a fixed string. It is funded at genesis.
	ThirdParty *ecdsa.PrivateKey
	// CheckSignatures makes the token check transferWithAuthorization's EIP-712 signature in its
	// own domain (TokenName, TokenVersion, ChainID, Token), as FiatToken does: by ecrecover for a
	// payer without code, by the payer's code otherwise (a greedy payer's, SetGreedy). Then a
	// greedy payer's address also answers eth_getCode with code, and a direct call of its
	// isValidSignature(bytes32,bytes) with the ERC-1271 magic value, cheaply: what verify asks of
	// a contract wallet passes, and only the token's own check inside a transaction burns the gas.
	// Off, the signature is not looked at (drivers that submit made-up signatures). A cancel's
	// signature is never checked.
	CheckSignatures bool
}

// Chain is an in-memory EVM-like chain that understands exactly what the engine does: signed
// EIP-1559 transactions into a geth-like pool, blocks mined on demand at the clock's time, the
// token's transferWithAuthorization and cancelAuthorization, receipts and logs, reorganisations,
// and the third parties that make the engine's life hard. It keeps every block it ever made
// (and the state after each), every transaction it ever saw, and the canonical uses of each
// authorization, for the simulation's oracle.
type Chain struct {
	mu     sync.Mutex
	cfg    ChainConfig
	clock  *Clock
	signer types.Signer
	trace  *Trace
	third  common.Address
	env    execEnv

	blocks  []*block               // every block ever made, in creation order (block.seq)
	byHash  map[common.Hash]*block // every block ever made
	canon   []*block               // the canonical chain, by number
	tips    []*block               // every head the chain has had, in order (lagging views pick from it)
	forks   int                    // reorganisations so far; salts the new branches' headers
	nextFee *big.Int               // SetNextBaseFee's override for the next block, nil: none
	tip     *big.Int

	pool    map[common.Address]map[uint64]*poolTx
	poolSeq uint64
	txs     map[common.Hash]*txRecord
	order   []common.Hash // txs in the order first seen
	nonces  map[senderNonce][]common.Hash
	// included lists every block (canonical or not) that holds a transaction.
	included map[common.Hash][]*block
	cheats   []cheat
}

type block struct {
	seq      int
	header   *types.Header
	hash     common.Hash
	number   uint64
	parent   *block
	size     uint64
	txs      []*types.Transaction
	senders  []common.Address
	receipts []*types.Receipt
	state    *state
}

type poolTx struct {
	tx   *types.Transaction
	from common.Address
	seq  uint64
}

type senderNonce struct {
	sender common.Address
	nonce  uint64
}

// Source says who put a transaction on the chain.
type Source string

const (
	SourceRPC        Source = "rpc"         // eth_sendRawTransaction (the engine, or anyone with a Backend)
	SourceForeign    Source = "foreign"     // SubmitForeign
	SourceThirdParty Source = "third-party" // ThirdPartyTransfer, Cancel, a reorg's conflicting transaction
)

type txRecord struct {
	tx     *types.Transaction
	from   common.Address
	source Source
	seen   int
	fate   string // why it left the pool without being mined, "" otherwise
}

// cheat is a direct state change (Fund, Mint) applied to the head in place, like anvil's
// setBalance. It is re-applied to a reorganisation's new branch when its block is dropped.
type cheat struct {
	at    uint64
	apply func(*state)
}

// NewChain returns a chain with only a genesis block, stamped with clock's time.
func NewChain(cfg ChainConfig, clock *Clock) *Chain {
	if cfg.ChainID == 0 {
		cfg.ChainID = 1337
	}
	if cfg.Token == (common.Address{}) {
		cfg.Token = common.HexToAddress("0x5FbDB2315678afecb367f032d93F642f64180aa3")
	}
	if cfg.TokenName == "" {
		cfg.TokenName = "USDC"
	}
	if cfg.TokenVersion == "" {
		cfg.TokenVersion = "2"
	}
	if cfg.GasLimit == 0 {
		cfg.GasLimit = 30_000_000
	}
	if cfg.BaseFee == nil {
		cfg.BaseFee = big.NewInt(1_000_000_000)
	}
	if cfg.SuggestedTip == nil {
		cfg.SuggestedTip = big.NewInt(1_000_000_000)
	}
	if cfg.PoolMinTip == nil {
		cfg.PoolMinTip = big.NewInt(1)
	}
	if cfg.SafeDepth == 0 {
		cfg.SafeDepth = 32
	}
	if cfg.FinalizedDepth == 0 {
		cfg.FinalizedDepth = 64
	}
	if cfg.ThirdParty == nil {
		k, err := crypto.ToECDSA(crypto.Keccak256([]byte("settlesim third party")))
		if err != nil {
			panic(err)
		}
		cfg.ThirdParty = k
	}
	c := &Chain{
		cfg: cfg, clock: clock, signer: types.LatestSignerForChainID(new(big.Int).SetUint64(cfg.ChainID)),
		third: crypto.PubkeyToAddress(cfg.ThirdParty.PublicKey),
		env: execEnv{token: cfg.Token, name: cfg.TokenName, version: cfg.TokenVersion, chainID: cfg.ChainID,
			checkSignatures: cfg.CheckSignatures, signatures: map[string]bool{}},
		byHash: map[common.Hash]*block{}, tip: new(big.Int).Set(cfg.SuggestedTip),
		pool: map[common.Address]map[uint64]*poolTx{}, txs: map[common.Hash]*txRecord{}, nonces: map[senderNonce][]common.Hash{},
		included: map[common.Hash][]*block{},
	}
	st := newState()
	st.eth[c.third] = new(big.Int).Mul(big.NewInt(1_000_000), big.NewInt(1e18))
	g := c.seal(nil, st, nil, nil, nil, uint64(clock.Now().Unix()), new(big.Int).Set(cfg.BaseFee), 0, []byte("settlesim genesis"))
	c.canon = []*block{g}
	c.tips = []*block{g}
	return c
}

// SetTrace makes the chain record its direct actions (mining, reorganisations, third parties)
// in t; the backends record the RPC traffic.
func (c *Chain) SetTrace(t *Trace) {
	c.mu.Lock()
	c.trace = t
	c.mu.Unlock()
}

// Config is the chain's configuration, defaults filled in.
func (c *Chain) Config() ChainConfig { return c.cfg }

// Token is the token's address.
func (c *Chain) Token() common.Address { return c.cfg.Token }

// ThirdParty is the address the third parties' transactions come from.
func (c *Chain) ThirdParty() common.Address { return c.third }

// Signer is the chain's transaction signer (EIP-155/1559 for its chain id).
func (c *Chain) Signer() types.Signer { return c.signer }

func (c *Chain) head() *block { return c.canon[len(c.canon)-1] }

// Fund sets addr's native balance at the head, as anvil_setBalance does.
func (c *Chain) Fund(addr common.Address, wei *big.Int) {
	v := new(big.Int).Set(wei)
	c.cheat("fund "+addr.Hex()+" "+v.String(), func(st *state) { st.eth[addr] = v })
}

// Mint sets addr's token balance at the head.
func (c *Chain) Mint(addr common.Address, amount *big.Int) {
	v := new(big.Int).Set(amount)
	c.cheat("mint "+addr.Hex()+" "+v.String(), func(st *state) { st.usdc[addr] = v })
}

// SetGreedy gives payer's address code (or takes it away) whose answer to the token's signature
// check burns all the gas it is given, as anvil_setCode would (an EOA delegating with EIP-7702
// after its payment was verified): a transaction carrying its authorization runs out of gas.
func (c *Chain) SetGreedy(payer common.Address, on bool) {
	c.cheat(fmt.Sprintf("greedy %s %v", payer.Hex(), on), func(st *state) {
		if st.greedy == nil {
			st.greedy = map[common.Address]bool{}
		}
		st.greedy[payer] = on
	})
}

func (c *Chain) cheat(what string, f func(*state)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trace.Record("chain %s", what)
	h := c.head()
	f(h.state)
	c.cheats = append(c.cheats, cheat{at: h.number, apply: f})
}

// SetSuggestedTip changes eth_maxPriorityFeePerGas's answer.
func (c *Chain) SetSuggestedTip(tip *big.Int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tip = new(big.Int).Set(tip)
	c.trace.Record("chain tip %s", tip)
}

// SetNextBaseFee makes the next block's base fee fee (a fee spike, or a drop that lets
// underpriced transactions in); the blocks after follow the usual rule from it.
func (c *Chain) SetNextBaseFee(fee *big.Int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextFee = new(big.Int).Set(fee)
	c.trace.Record("chain next-base-fee %s", fee)
}

// nextBaseFee is the base fee of a block on parent (EIP-1559: elasticity 2, denominator 8).
func (c *Chain) nextBaseFee(parent *block) *big.Int {
	if c.nextFee != nil && parent == c.head() {
		return new(big.Int).Set(c.nextFee)
	}
	fee := parent.header.BaseFee
	if c.cfg.FixedBaseFee {
		return new(big.Int).Set(fee)
	}
	target := parent.header.GasLimit / 2
	used := parent.header.GasUsed
	switch {
	case used == target:
		return new(big.Int).Set(fee)
	case used > target:
		d := new(big.Int).Mul(fee, new(big.Int).SetUint64(used-target))
		d.Div(d, new(big.Int).SetUint64(target))
		d.Div(d, big.NewInt(8))
		if d.Sign() == 0 {
			d.SetInt64(1)
		}
		return d.Add(d, fee)
	default:
		d := new(big.Int).Mul(fee, new(big.Int).SetUint64(target-used))
		d.Div(d, new(big.Int).SetUint64(target))
		d.Div(d, big.NewInt(8))
		return d.Sub(fee, d)
	}
}

// Block is a block as the oracle sees it.
type Block struct {
	Number     uint64
	Hash       common.Hash
	ParentHash common.Hash
	Time       uint64
	BaseFee    *big.Int
	GasUsed    uint64
	Txs        []common.Hash
}

func (b *block) info() Block {
	out := Block{Number: b.number, Hash: b.hash, ParentHash: b.header.ParentHash, Time: b.header.Time,
		BaseFee: new(big.Int).Set(b.header.BaseFee), GasUsed: b.header.GasUsed}
	for _, tx := range b.txs {
		out.Txs = append(out.Txs, tx.Hash())
	}
	return out
}

// Head is the canonical head.
func (c *Chain) Head() Block {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.head().info()
}

// BlockByNumber is the canonical block at n.
func (c *Chain) BlockByNumber(n uint64) (Block, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n >= uint64(len(c.canon)) {
		return Block{}, false
	}
	return c.canon[n].info(), true
}

// seal executes nothing: it builds the block of already executed txs and receipts on parent,
// fills in the fields only the block's hash decides, and registers it.
func (c *Chain) seal(parent *block, st *state, txs []*types.Transaction, senders []common.Address, receipts []*types.Receipt,
	time uint64, baseFee *big.Int, gasUsed uint64, extra []byte) *block {
	h := &types.Header{
		Number: new(big.Int), GasLimit: c.cfg.GasLimit, GasUsed: gasUsed, Time: time, BaseFee: baseFee,
		Difficulty: new(big.Int), Extra: extra, BlobGasUsed: new(uint64), ExcessBlobGas: new(uint64),
		ParentBeaconRoot: &common.Hash{}, RequestsHash: &types.EmptyRequestsHash,
	}
	var parentRoot common.Hash
	if parent != nil {
		h.ParentHash, h.Number = parent.hash, new(big.Int).SetUint64(parent.number+1)
		parentRoot = parent.header.Root
	}
	// No state trie: the root only has to differ between blocks whose states may differ.
	var buf [16]byte
	binary.BigEndian.PutUint64(buf[:8], h.Number.Uint64())
	binary.BigEndian.PutUint64(buf[8:], time)
	seed := [][]byte{parentRoot[:], buf[:], extra}
	for _, tx := range txs {
		th := tx.Hash()
		seed = append(seed, th[:])
	}
	h.Root = crypto.Keccak256Hash(seed...)
	h.MixDigest = crypto.Keccak256Hash(h.Root[:], []byte("prevrandao"))
	var cumulative uint64
	for _, r := range receipts {
		cumulative += r.GasUsed
		r.CumulativeGasUsed = cumulative
		r.Bloom = types.CreateBloom(r)
	}
	full := types.NewBlock(h, &types.Body{Transactions: txs, Withdrawals: []*types.Withdrawal{}}, receipts, &listHasher{})
	b := &block{seq: len(c.blocks), header: full.Header(), hash: full.Hash(), number: h.Number.Uint64(), parent: parent,
		size: full.Size(), txs: txs, senders: senders, receipts: receipts, state: st}
	var logIndex uint
	for i, r := range receipts {
		r.BlockHash, r.BlockNumber, r.TransactionIndex = b.hash, new(big.Int).SetUint64(b.number), uint(i)
		for _, l := range r.Logs {
			l.BlockHash, l.BlockNumber, l.TxHash, l.TxIndex, l.Index, l.BlockTimestamp = b.hash, b.number, r.TxHash, uint(i), logIndex, time
			logIndex++
		}
	}
	for k, u := range st.auths {
		if u.BlockNumber == b.number && u.BlockHash == (common.Hash{}) {
			u.BlockHash = b.hash
			st.auths[k] = u
		}
	}
	for _, tx := range txs {
		c.included[tx.Hash()] = append(c.included[tx.Hash()], b)
	}
	c.blocks = append(c.blocks, b)
	c.byHash[b.hash] = b
	return b
}

// errInvalidTx: a transaction a block cannot include (its nonce or its gas cannot be paid).
var errInvalidTx = errors.New("invalid transaction")

// apply runs tx from sender in a block being built: it checks what a block builder checks,
// charges the gas and returns the receipt (block fields left for seal).
func (c *Chain) apply(st *state, env execEnv, baseFee *big.Int, tx *types.Transaction, from common.Address) (*types.Receipt, error) {
	if st.nonces[from] != tx.Nonce() {
		return nil, fmt.Errorf("%w: nonce %d, state %d", errInvalidTx, tx.Nonce(), st.nonces[from])
	}
	if tx.GasFeeCap().Cmp(baseFee) < 0 {
		return nil, fmt.Errorf("%w: fee cap below base fee", errInvalidTx)
	}
	// The upfront charge is the gas limit at the fee cap (geth's buyGas), refunded down to use.
	if st.balance(from).Cmp(tx.Cost()) < 0 {
		return nil, fmt.Errorf("%w: insufficient funds for gas * price + value", errInvalidTx)
	}
	price := new(big.Int).Add(baseFee, tx.GasTipCap())
	if price.Cmp(tx.GasFeeCap()) > 0 {
		price.Set(tx.GasFeeCap())
	}
	res := run(env, st, from, tx.To(), tx.Value(), tx.Data())
	rcpt := &types.Receipt{Type: tx.Type(), TxHash: tx.Hash(), EffectiveGasPrice: price, Logs: []*types.Log{}}
	switch {
	case tx.Gas() < res.gas:
		rcpt.Status, rcpt.GasUsed = types.ReceiptStatusFailed, tx.Gas() // out of gas: all of it is used
	case res.reverted:
		rcpt.Status, rcpt.GasUsed = types.ReceiptStatusFailed, res.gas
	default:
		rcpt.Status, rcpt.GasUsed = types.ReceiptStatusSuccessful, res.gas
		rcpt.Logs = res.logs
		if res.commit != nil {
			res.commit(st, tx.Hash())
		}
	}
	fee := new(big.Int).Mul(price, new(big.Int).SetUint64(rcpt.GasUsed))
	st.eth[from] = new(big.Int).Sub(st.balance(from), fee)
	st.nonces[from] = tx.Nonce() + 1
	return rcpt, nil
}

func (c *Chain) envAt(number, time uint64) execEnv {
	e := c.env
	e.number, e.time = number, time
	return e
}

// blockTime is the timestamp of a new block on parent: the clock's, but always past the
// parent's, as real chains require (anvil does the same when mining faster than a second).
func blockTime(parent *block, want uint64) uint64 {
	return max(want, parent.header.Time+1)
}

// Mine makes a block at the clock's time on the head with the pool's transactions: each sender's
// in nonce order from its account nonce, the best-paying first, only those whose fee cap covers
// the base fee, up to the gas limit.
func (c *Chain) Mine() Block {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.mineLocked()
	c.trace.Record("chain mine %d %s txs=%d base=%s", b.number, b.hash.Hex(), len(b.txs), b.header.BaseFee)
	return b.info()
}

func (c *Chain) mineLocked() *block {
	parent := c.head()
	baseFee := c.nextBaseFee(parent)
	c.nextFee = nil
	time := blockTime(parent, uint64(c.clock.Now().Unix()))
	st := parent.state.copy()
	env := c.envAt(parent.number+1, time)

	// Each sender's executable run, as geth's pending set filtered by the base fee: it stops at a
	// nonce gap or at the first transaction whose fee cap is below the base fee.
	runs := map[common.Address][]*poolTx{}
	for _, from := range c.poolSenders() {
		var seq []*poolTx
		for n := st.nonces[from]; ; n++ {
			p := c.pool[from][n]
			if p == nil || p.tx.GasFeeCap().Cmp(baseFee) < 0 {
				break
			}
			seq = append(seq, p)
		}
		if len(seq) > 0 {
			runs[from] = seq
		}
	}
	var (
		txs      []*types.Transaction
		senders  []common.Address
		receipts []*types.Receipt
		gasLeft  = c.cfg.GasLimit
	)
	for gasLeft >= txGas {
		var best *poolTx
		for _, from := range sortedAddrs(runs) {
			p := runs[from][0]
			if best == nil || betterTip(p, best, baseFee) {
				best = p
			}
		}
		if best == nil {
			break
		}
		from := best.from
		if best.tx.Gas() > gasLeft {
			delete(runs, from) // geth pops the account: its later nonces cannot go first
			continue
		}
		rcpt, err := c.apply(st, env, baseFee, best.tx, from)
		if err != nil {
			delete(runs, from)
			continue
		}
		gasLeft -= rcpt.GasUsed
		txs, senders, receipts = append(txs, best.tx), append(senders, from), append(receipts, rcpt)
		if runs[from] = runs[from][1:]; len(runs[from]) == 0 {
			delete(runs, from)
		}
	}
	b := c.seal(parent, st, txs, senders, receipts, time, baseFee, c.cfg.GasLimit-gasLeft, []byte("settlesim"))
	c.setHead(b)
	return b
}

// betterTip orders pooled transactions for a block: the higher effective tip first, then the
// one seen first (geth's price-and-time order).
func betterTip(a, b *poolTx, baseFee *big.Int) bool {
	if c := a.tx.EffectiveGasTipValue(baseFee).Cmp(b.tx.EffectiveGasTipValue(baseFee)); c != 0 {
		return c > 0
	}
	return a.seq < b.seq
}

// setHead makes b the canonical head (b's ancestors the canonical chain) and prunes the pool of
// what b's state makes stale.
func (c *Chain) setHead(b *block) {
	var branch []*block
	for x := b; x != nil && (x.number >= uint64(len(c.canon)) || c.canon[x.number] != x); x = x.parent {
		branch = append(branch, x)
	}
	slices.Reverse(branch)
	if len(branch) > 0 {
		c.canon = append(c.canon[:branch[0].number], branch...)
	}
	c.canon = c.canon[:b.number+1]
	c.tips = append(c.tips, b)
	for _, x := range branch {
		for _, tx := range x.txs {
			c.unpool(tx.Hash(), "")
		}
	}
	for _, from := range c.poolSenders() {
		next := b.state.nonces[from]
		for _, n := range sortedNonces(c.pool[from]) {
			if n < next {
				c.unpool(c.pool[from][n].tx.Hash(), "nonce used")
			}
		}
	}
}

func (c *Chain) poolSenders() []common.Address { return sortedAddrs(c.pool) }

func (c *Chain) unpool(h common.Hash, fate string) bool {
	r := c.txs[h]
	if r == nil {
		return false
	}
	from, n := r.from, r.tx.Nonce()
	if p := c.pool[from][n]; p != nil && p.tx.Hash() == h {
		delete(c.pool[from], n)
		if len(c.pool[from]) == 0 {
			delete(c.pool, from)
		}
		if fate != "" {
			r.fate = fate
		}
		return true
	}
	return false
}

// record notes a transaction the chain has seen, once.
func (c *Chain) record(tx *types.Transaction, from common.Address, src Source) {
	h := tx.Hash()
	if c.txs[h] != nil {
		return
	}
	c.txs[h] = &txRecord{tx: tx, from: from, source: src, seen: len(c.order)}
	c.order = append(c.order, h)
	k := senderNonce{from, tx.Nonce()}
	c.nonces[k] = append(c.nonces[k], h)
}

// SendRaw is eth_sendRawTransaction against the canonical head: it decodes raw, recovers its
// sender and admits it to the pool under geth's rules. The error is geth's, as an *RPCError.
func (c *Chain) SendRaw(raw []byte) (common.Hash, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.sendRawLocked(raw, c.head())
	c.trace.Record("chain send %s %v", h.Hex(), err)
	if err != nil {
		return common.Hash{}, err
	}
	return h, nil
}

func (c *Chain) sendRawLocked(raw []byte, at *block) (common.Hash, *RPCError) {
	tx := new(types.Transaction)
	if err := tx.UnmarshalBinary(raw); err != nil {
		return common.Hash{}, rpcErr(-32000, err.Error())
	}
	if tx.Type() == types.BlobTxType || tx.Type() == types.SetCodeTxType {
		return common.Hash{}, rpcErr(-32000, fmt.Sprintf("transaction type not supported: tx type %d not supported by this pool", tx.Type()))
	}
	from, err := types.Sender(c.signer, tx)
	if err != nil {
		return common.Hash{}, rpcErr(-32000, "invalid sender: "+err.Error())
	}
	if e := c.admit(tx, from, at, SourceRPC, false); e != nil {
		return common.Hash{}, e
	}
	return tx.Hash(), nil
}

// admit validates tx as geth's pool does, in geth's order, against the state of at (the block
// the answering node is on) and, when that is not the head, silently against the head's too: a
// lagging node accepts what the rest of the network then drops. force skips the replacement
// rule (a builder that saw the transaction first).
func (c *Chain) admit(tx *types.Transaction, from common.Address, at *block, src Source, force bool) *RPCError {
	h := tx.Hash()
	if p := c.pool[from][tx.Nonce()]; p != nil && p.tx.Hash() == h {
		return rpcErr(-32000, "already known")
	}
	if e := c.validate(tx, from, at); e != nil {
		return e
	}
	old := c.pool[from][tx.Nonce()]
	if old != nil && !force && !replaces(old.tx, tx) {
		return rpcErr(-32000, "replacement transaction underpriced")
	}
	c.record(tx, from, src)
	if at != c.head() && c.validate(tx, from, c.head()) != nil {
		c.txs[h].fate = "refused by the network"
		return nil
	}
	if old != nil {
		c.unpool(old.tx.Hash(), "replaced by "+h.Hex())
	}
	if c.pool[from] == nil {
		c.pool[from] = map[uint64]*poolTx{}
	}
	c.poolSeq++
	c.pool[from][tx.Nonce()] = &poolTx{tx: tx, from: from, seq: c.poolSeq}
	c.txs[h].fate = ""
	return nil
}

// validate is geth's ValidateTransaction and ValidateTransactionWithState for the checks that
// matter here, with geth's messages.
func (c *Chain) validate(tx *types.Transaction, from common.Address, at *block) *RPCError {
	switch {
	case tx.Gas() > c.cfg.GasLimit:
		return rpcErr(-32000, "exceeds block gas limit")
	case tx.GasFeeCap().Cmp(tx.GasTipCap()) < 0:
		return rpcErr(-32000, "max priority fee per gas higher than max fee per gas")
	case tx.Gas() < intrinsicGas(tx.Data()):
		return rpcErr(-32000, fmt.Sprintf("intrinsic gas too low: gas %d, minimum needed %d", tx.Gas(), intrinsicGas(tx.Data())))
	case tx.GasTipCap().Cmp(c.cfg.PoolMinTip) < 0:
		return rpcErr(-32000, fmt.Sprintf("transaction gas price below minimum: gas tip cap %s, minimum needed %s", tx.GasTipCap(), c.cfg.PoolMinTip))
	}
	st := at.state
	if next := st.nonces[from]; next > tx.Nonce() {
		return rpcErr(-32000, fmt.Sprintf("nonce too low: next nonce %d, tx nonce %d", next, tx.Nonce()))
	}
	balance, cost := st.balance(from), tx.Cost()
	if balance.Cmp(cost) < 0 {
		return rpcErr(-32000, fmt.Sprintf("insufficient funds for gas * price + value: balance %s, tx cost %s, overshot %s",
			balance, cost, new(big.Int).Sub(cost, balance)))
	}
	// What the account's other pooled transactions may cost too (a replacement's predecessor
	// does not count: it leaves).
	spent := new(big.Int)
	for n, p := range c.pool[from] {
		if n != tx.Nonce() {
			spent.Add(spent, p.tx.Cost())
		}
	}
	if need := new(big.Int).Add(spent, cost); balance.Cmp(need) < 0 {
		return rpcErr(-32000, fmt.Sprintf("insufficient funds for gas * price + value: balance %s, queued cost %s, tx cost %s, overshot %s",
			balance, spent, cost, new(big.Int).Sub(need, balance)))
	}
	if c.cfg.RejectBelowBaseFee {
		if fee := c.nextBaseFee(c.head()); tx.GasFeeCap().Cmp(fee) < 0 {
			return rpcErr(-32000, fmt.Sprintf("max fee per gas less than block base fee: address %s, maxFeePerGas: %s, baseFee: %s", from.Hex(), tx.GasFeeCap(), fee))
		}
	}
	return nil
}

// replaces is geth's replacement rule (legacypool list.Add, price bump 10%): both the fee cap
// and the tip must be higher than the old one's, and at least 110% of it.
func replaces(old, tx *types.Transaction) bool {
	if old.GasFeeCapCmp(tx) >= 0 || old.GasTipCapCmp(tx) >= 0 {
		return false
	}
	bump := func(x *big.Int) *big.Int {
		out := new(big.Int).Mul(x, big.NewInt(110))
		return out.Div(out, big.NewInt(100))
	}
	return tx.GasFeeCap().Cmp(bump(old.GasFeeCap())) >= 0 && tx.GasTipCap().Cmp(bump(old.GasTipCap())) >= 0
}

// pendingNonce is the nonce a node on at answers for "pending": the account's nonce at that
// block, past every transaction the pool holds for it without a gap.
func (c *Chain) pendingNonce(from common.Address, at *block) uint64 {
	n := at.state.nonces[from]
	for c.pool[from][n] != nil {
		n++
	}
	return n
}

// ForeignTx is a transaction the engine did not sign: on one of our signer keys (an operator
// using the key elsewhere), or from anyone.
type ForeignTx struct {
	// Key signs it; when nil, From is impersonated (as anvil_impersonateAccount: a valid-looking
	// transaction whose signature is not From's; the chain attributes it to From all the same).
	Key  *ecdsa.PrivateKey
	From common.Address
	// Nonce is the nonce to take; nil: the account's next pending nonce.
	Nonce *uint64
	// To and Data: a zero-value transfer to From itself when both are unset.
	To   *common.Address
	Data []byte
	// TipCap and FeeCap: nil outbids whatever the pool holds at the nonce by 25%, and the
	// current suggestion.
	TipCap, FeeCap *big.Int
	// Gas: 0 is what the call needs, plus a quarter.
	Gas uint64
	// Force takes the nonce's pool slot whatever the fees (the builder saw this one first).
	Force bool
}

// SubmitForeign puts f into the pool under the pool's rules (Force aside); the error is the
// pool's refusal.
func (c *Chain) SubmitForeign(f ForeignTx) (common.Hash, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tx, from, err := c.submitLocked(f, SourceForeign)
	c.trace.Record("chain foreign %s nonce=%d force=%v -> %s %v", from.Hex(), tx.Nonce(), f.Force, tx.Hash().Hex(), err)
	if err != nil {
		return common.Hash{}, err
	}
	return tx.Hash(), nil
}

func (c *Chain) submitLocked(f ForeignTx, src Source) (*types.Transaction, common.Address, *RPCError) {
	tx, from := c.buildLocked(f)
	return tx, from, c.admit(tx, from, c.head(), src, f.Force)
}

// buildLocked signs f (or impersonates its sender) with the defaults filled in.
func (c *Chain) buildLocked(f ForeignTx) (*types.Transaction, common.Address) {
	from := f.From
	if f.Key != nil {
		from = crypto.PubkeyToAddress(f.Key.PublicKey)
	}
	head := c.head()
	var nonce uint64
	if f.Nonce != nil {
		nonce = *f.Nonce
	} else {
		nonce = c.pendingNonce(from, head)
	}
	to := f.To
	if to == nil && len(f.Data) == 0 {
		to = &from
	}
	tip, feeCap := f.TipCap, f.FeeCap
	if tip == nil || feeCap == nil {
		baseFee := c.nextBaseFee(head)
		t := new(big.Int).Set(c.tip)
		fc := new(big.Int).Add(new(big.Int).Mul(baseFee, big.NewInt(2)), t)
		if old := c.pool[from][nonce]; old != nil {
			t = maxBig(t, plusQuarter(old.tx.GasTipCap()))
			fc = maxBig(fc, plusQuarter(old.tx.GasFeeCap()))
		}
		if tip == nil {
			tip = t
		}
		if feeCap == nil {
			feeCap = maxBig(fc, tip)
		}
	}
	gas := f.Gas
	if gas == 0 {
		env := c.envAt(head.number+1, blockTime(head, uint64(c.clock.Now().Unix())))
		res := run(env, head.state, from, to, nil, f.Data)
		gas = res.gas + res.gas/4
	}
	key := f.Key
	if key == nil {
		// Impersonation: a key of the sender's own, so that two senders' identical transactions
		// still differ in hash.
		k, err := crypto.ToECDSA(crypto.Keccak256([]byte("settlesim impersonate"), from[:]))
		if err != nil {
			panic(err)
		}
		key = k
	}
	tx, err := ethrpc.NewSigner(c.cfg.ChainID, key).Sign(nonce, to, f.Data, gas, tip, feeCap)
	if err != nil {
		panic(err) // only on a programming error
	}
	return tx, from
}

func plusQuarter(x *big.Int) *big.Int {
	out := new(big.Int).Mul(x, big.NewInt(5))
	return out.Div(out.Add(out, big.NewInt(3)), big.NewInt(4))
}

func maxBig(a, b *big.Int) *big.Int {
	if a.Cmp(b) >= 0 {
		return new(big.Int).Set(a)
	}
	return new(big.Int).Set(b)
}

// thirdPartyTx is a transaction of the third party's calling the token with data, paying twice
// the suggested tip, so that a block takes it before the engine's.
func (c *Chain) thirdPartyTx(data []byte) ForeignTx {
	tip := new(big.Int).Mul(c.tip, big.NewInt(2))
	fee := new(big.Int).Add(new(big.Int).Mul(c.nextBaseFee(c.head()), big.NewInt(2)), tip)
	to := c.cfg.Token
	return ForeignTx{Key: c.cfg.ThirdParty, To: &to, Data: data, TipCap: tip, FeeCap: fee}
}

// ThirdPartyTransfer submits calldata (a transferWithAuthorization the engine was given, say)
// from the third party to the token: a facilitator that is not us settling the same
// authorization. It pays more than the suggested tip, so the next block takes it first.
func (c *Chain) ThirdPartyTransfer(calldata []byte) (common.Hash, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tx, _, err := c.submitLocked(c.thirdPartyTx(calldata), SourceThirdParty)
	c.trace.Record("chain third-party transfer nonce=%d -> %s %v", tx.Nonce(), tx.Hash().Hex(), err)
	if err != nil {
		return common.Hash{}, err
	}
	return tx.Hash(), nil
}

// Cancel submits the authorizer's cancelAuthorization(payer, nonce), relayed by the third party.
func (c *Chain) Cancel(payer common.Address, nonce [32]byte) (common.Hash, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tx, _, err := c.submitLocked(c.thirdPartyTx(cancelCalldata(payer, nonce)), SourceThirdParty)
	c.trace.Record("chain cancel %s %x -> %s %v", payer.Hex(), nonce, tx.Hash().Hex(), err)
	if err != nil {
		return common.Hash{}, err
	}
	return tx.Hash(), nil
}

// DropFromPool removes a transaction from the pool (a node restart, eviction); it reports
// whether it was there.
func (c *Chain) DropFromPool(h common.Hash) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := c.unpool(h, "dropped from the pool")
	c.trace.Record("chain drop %s %v", h.Hex(), ok)
	return ok
}

// DropPool empties the pool; it returns how many transactions it held.
func (c *Chain) DropPool() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, from := range c.poolSenders() {
		for _, nonce := range sortedNonces(c.pool[from]) {
			if c.unpool(c.pool[from][nonce].tx.Hash(), "dropped from the pool") {
				n++
			}
		}
	}
	c.trace.Record("chain drop-pool %d", n)
	return n
}

// Pool lists the pooled transactions' hashes, by sender then nonce.
func (c *Chain) Pool() []common.Hash {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []common.Hash
	for _, from := range c.poolSenders() {
		for _, n := range sortedNonces(c.pool[from]) {
			out = append(out, c.pool[from][n].tx.Hash())
		}
	}
	return out
}

func sortedAddrs[V any](m map[common.Address]V) []common.Address {
	keys := make([]common.Address, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b common.Address) int { return a.Cmp(b) })
	return keys
}

func sortedNonces[V any](m map[uint64]V) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// listHasher stands in for the Merkle-Patricia trie of the transactions and receipts roots: a
// hash of the list's encoding, deterministic and different for different lists, which is all
// that anything reading the roots here needs.
type listHasher struct{ parts [][]byte }

func (h *listHasher) Reset() { h.parts = h.parts[:0] }

func (h *listHasher) Update(key, value []byte) error {
	h.parts = append(h.parts, append(append([]byte{}, key...), value...))
	return nil
}

func (h *listHasher) Hash() common.Hash { return crypto.Keccak256Hash(h.parts...) }
