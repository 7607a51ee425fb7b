package settlesim

import (
	"math/big"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/multicall3"
)

// FiatToken's revert strings: verify and the engine read them only through "execution
// reverted", but a driver comparing diagnoses wants the real ones.
const (
	revertNotYetValid = "FiatTokenV2: authorization is not yet valid"
	revertExpired     = "FiatTokenV2: authorization is expired"
	revertUsed        = "FiatTokenV2: authorization is used or canceled"
	revertBalance     = "ERC20: transfer amount exceeds balance"
	revertZeroAddress = "ERC20: transfer to the zero address"
	revertSignature   = "FiatTokenV2: invalid signature"
	revertUnknown     = "" // a call FiatToken has no function for reverts without a reason
)

// Gas the token's calls use beyond the intrinsic cost. Calibrated so that a transfer by
// authorization uses about 96,000 gas, as on anvil with Circle's USDC; a revert stops early.
const (
	transferExecGas = 72_000
	cancelExecGas   = 36_000
	erc20ExecGas    = 30_000
	viewExecGas     = 3_000
	revertExecGas   = 9_000
	txGas           = 21_000
	greedyGas       = 1 << 40
)

// tokenCode is what eth_getCode answers for the token: any non-empty code tells verify that the
// asset is deployed.
var tokenCode = common.FromHex("0x608060405234801561001057600080fd5b50")

// walletCode is what eth_getCode answers for a greedy payer when the chain checks signatures:
// any non-empty code makes verify treat the payer as a contract wallet.
var walletCode = common.FromHex("0x6080604052600436106100")

// erc1271Magic is isValidSignature's selector, and its answer for a valid signature.
var erc1271Magic = [4]byte{0x16, 0x26, 0xba, 0x7e}

// UseKind is how an authorization was used on chain.
type UseKind string

const (
	UseTransfer UseKind = "transfer" // transferWithAuthorization
	UseCancel   UseKind = "cancel"   // cancelAuthorization
)

// Use is an authorization's use on chain: the transaction that used it and what it did.
type Use struct {
	Kind   UseKind
	TxHash common.Hash
	// Sender is the transaction's sender (ours, a third party's), not the authorizer.
	Sender      common.Address
	BlockNumber uint64
	BlockHash   common.Hash
	// To and Value are the transfer's (zero for a cancel).
	To    common.Address
	Value *big.Int
}

type authKey struct {
	authorizer common.Address
	nonce      [32]byte
}

// state is the world after a block: every block keeps its own, so that reads at any block (a
// lagging node's "latest", EIP-1898 reads at a reorganised block) answer from that block.
// Balances are never mutated in place: a *big.Int in a state may be shared with its parent's.
type state struct {
	nonces map[common.Address]uint64
	eth    map[common.Address]*big.Int
	usdc   map[common.Address]*big.Int
	auths  map[authKey]Use // BlockHash left zero: it is not known while the block executes
	// greedy are the payers whose address has code (Chain.SetGreedy) that burns the gas the
	// token's signature check of it is given: their authorization's transfer runs out of gas.
	greedy map[common.Address]bool
}

func newState() *state {
	return &state{nonces: map[common.Address]uint64{}, eth: map[common.Address]*big.Int{},
		usdc: map[common.Address]*big.Int{}, auths: map[authKey]Use{}}
}

func (s *state) copy() *state {
	out := &state{nonces: make(map[common.Address]uint64, len(s.nonces)), eth: make(map[common.Address]*big.Int, len(s.eth)),
		usdc: make(map[common.Address]*big.Int, len(s.usdc)), auths: make(map[authKey]Use, len(s.auths)), greedy: make(map[common.Address]bool, len(s.greedy))}
	for k, v := range s.greedy {
		out.greedy[k] = v
	}
	for k, v := range s.nonces {
		out.nonces[k] = v
	}
	for k, v := range s.eth {
		out.eth[k] = v
	}
	for k, v := range s.usdc {
		out.usdc[k] = v
	}
	for k, v := range s.auths {
		out.auths[k] = v
	}
	return out
}

var zero = new(big.Int)

func (s *state) balance(a common.Address) *big.Int {
	if b := s.eth[a]; b != nil {
		return b
	}
	return zero
}

func (s *state) tokens(a common.Address) *big.Int {
	if b := s.usdc[a]; b != nil {
		return b
	}
	return zero
}

// execEnv is what a call sees of the block it runs in.
type execEnv struct {
	token   common.Address
	name    string
	version string
	chainID uint64
	number  uint64
	time    uint64
	// checkSignatures: ChainConfig.CheckSignatures; signatures remembers each transfer calldata's
	// verdict (the domain is the chain's, fixed), since ecrecover was the largest cost of a run
	// and the same calldata is run many times (calls, estimates, blocks, reorganisations). Used
	// under the chain's lock, as every run is.
	checkSignatures bool
	signatures      map[string]bool
}

// signedByPayer reports whether the transfer's signature recovers to its payer in the token's
// domain.
func (env execEnv) signedByPayer(data []byte, a facilitator.Authorization, sig []byte) bool {
	ok, known := env.signatures[string(data)]
	if !known {
		ok = eip3009.RecoverEOA(eip3009.AuthorizationDigest(eip3009.DomainSeparator(env.name, env.version, env.chainID, env.token), a), sig, a.From)
		env.signatures[string(data)] = ok
	}
	return ok
}

// callResult is the outcome of running a call against the token (or any other address).
type callResult struct {
	ret      []byte
	logs     []*types.Log
	reverted bool
	reason   string
	// gas is what the call needs in all, intrinsic cost included: on success the gas used, on a
	// revert the gas up to the revert.
	gas    uint64
	commit func(st *state, tx common.Hash) // applies the call's effects; nil when it has none
}

// intrinsicGas is the cost of a transaction before it executes (EIP-2028 calldata pricing).
func intrinsicGas(data []byte) uint64 {
	g := uint64(txGas)
	for _, b := range data {
		if b == 0 {
			g += 4
		} else {
			g += 16
		}
	}
	return g
}

// run executes a call of data from sender to to with value, against st, without changing st:
// the effects come back as commit, so eth_call and a mined transaction share one code path.
func run(env execEnv, st *state, sender common.Address, to *common.Address, value *big.Int, data []byte) callResult {
	base := intrinsicGas(data)
	if to != nil && *to == multicall3.Address {
		return aggregate3(env, st, sender, value, data)
	}
	if to != nil && env.checkSignatures && st.greedy[*to] && len(data) >= 4 && [4]byte(data[:4]) == erc1271Magic {
		// A greedy payer's wallet asked directly (verify's ERC-1271 check): it accepts any
		// signature, cheaply. Only the token's check inside a transaction burns the gas.
		return callResult{ret: common.RightPadBytes(erc1271Magic[:], 32), gas: base + viewExecGas}
	}
	if to == nil || *to != env.token {
		// A plain transfer (the dummy transactions a foreign sender puts on our key).
		res := callResult{gas: base}
		if value != nil && value.Sign() > 0 {
			dst := common.Address{}
			if to != nil {
				dst = *to
			}
			v := new(big.Int).Set(value)
			res.commit = func(st *state, _ common.Hash) {
				st.eth[sender] = new(big.Int).Sub(st.balance(sender), v)
				st.eth[dst] = new(big.Int).Add(st.balance(dst), v)
			}
		}
		return res
	}
	revert := func(reason string) callResult {
		return callResult{reverted: true, reason: reason, gas: base + revertExecGas}
	}
	if value != nil && value.Sign() > 0 || len(data) < 4 {
		return revert(revertUnknown) // FiatToken is not payable and has no fallback
	}
	c, ok := eip3009.DecodeCall(data)
	if !ok {
		return revert(revertUnknown)
	}
	switch c.Method {
	case eip3009.MethodTransferWithAuthorization:
		a := c.Authorization
		key := authKey{a.From, a.Nonce}
		now := new(big.Int).SetUint64(env.time)
		switch {
		case now.Cmp(a.ValidAfter) <= 0:
			return revert(revertNotYetValid)
		case now.Cmp(a.ValidBefore) >= 0:
			return revert(revertExpired)
		}
		if _, used := st.auths[key]; used {
			return revert(revertUsed)
		}
		if st.greedy[a.From] {
			// The token asks the payer's code about the signature, which burns all it is given:
			// more than any transaction's limit, so the transaction runs out of gas.
			return callResult{reverted: true, reason: "out of gas", gas: greedyGas}
		}
		// Unless the chain checks signatures, the EIP-712 signature is not looked at: verify checks
		// it before anything is signed, and third parties submit copies of signed calldata.
		if env.checkSignatures && !env.signedByPayer(data, a, c.Signature) {
			return revert(revertSignature)
		}
		if a.To == (common.Address{}) {
			return revert(revertZeroAddress)
		}
		if st.tokens(a.From).Cmp(a.Value) < 0 {
			return revert(revertBalance)
		}
		logs := []*types.Log{eip3009.AuthorizationLog(env.token, a.From, a.Nonce, false), eip3009.TransferLog(env.token, a.From, a.To, a.Value)}
		return callResult{ret: []byte{}, logs: logs, gas: base + transferExecGas, commit: func(st *state, tx common.Hash) {
			st.auths[key] = Use{Kind: UseTransfer, TxHash: tx, Sender: sender, BlockNumber: env.number, To: a.To, Value: new(big.Int).Set(a.Value)}
			st.usdc[a.From] = new(big.Int).Sub(st.tokens(a.From), a.Value)
			st.usdc[a.To] = new(big.Int).Add(st.tokens(a.To), a.Value)
		}}
	case eip3009.MethodCancelAuthorization:
		key := authKey{c.Authorization.From, c.Authorization.Nonce}
		if _, used := st.auths[key]; used {
			return revert(revertUsed)
		}
		logs := []*types.Log{eip3009.AuthorizationLog(env.token, key.authorizer, key.nonce, true)}
		return callResult{ret: []byte{}, logs: logs, gas: base + cancelExecGas, commit: func(st *state, tx common.Hash) {
			st.auths[key] = Use{Kind: UseCancel, TxHash: tx, Sender: sender, BlockNumber: env.number, Value: new(big.Int)}
		}}
	case eip3009.MethodTransfer:
		dst, v := c.Account, c.Value
		if dst == (common.Address{}) {
			return revert(revertZeroAddress)
		}
		if st.tokens(sender).Cmp(v) < 0 {
			return revert(revertBalance)
		}
		logs := []*types.Log{eip3009.TransferLog(env.token, sender, dst, v)}
		return callResult{ret: common.LeftPadBytes([]byte{1}, 32), logs: logs, gas: base + erc20ExecGas, commit: func(st *state, _ common.Hash) {
			st.usdc[sender] = new(big.Int).Sub(st.tokens(sender), v)
			st.usdc[dst] = new(big.Int).Add(st.tokens(dst), v)
		}}
	case eip3009.MethodAuthorizationState:
		_, used := st.auths[authKey{c.Authorization.From, c.Authorization.Nonce}]
		return callResult{ret: tokenAnswer(c.Method, used), gas: base + viewExecGas}
	case eip3009.MethodBalanceOf:
		return callResult{ret: tokenAnswer(c.Method, new(big.Int).Set(st.tokens(c.Account))), gas: base + viewExecGas}
	case eip3009.MethodName:
		return callResult{ret: tokenAnswer(c.Method, env.name), gas: base + viewExecGas}
	case eip3009.MethodVersion:
		return callResult{ret: tokenAnswer(c.Method, env.version), gas: base + viewExecGas}
	case eip3009.MethodDecimals:
		return callResult{ret: tokenAnswer(c.Method, uint8(6)), gas: base + viewExecGas}
	}
	return revert(revertUnknown)
}

// Multicall3's gas beyond its calls' own: the loop and framing per call, and a batch's own
// (anvil with Circle's USDC: a batch of n transfers uses about 21,000 + n × 65,000).
const (
	aggregateCallGas = 2_000
	aggregateExecGas = 8_000
)

// aggregate3 executes Multicall3's aggregate3(calls) as the contract does: the calls one after
// the other from Multicall3, each seeing the effects of those before it; a call that reverts with
// allowFailure is answered failed and changes nothing, one without it reverts the whole batch.
// Only a batch calldata decodes as runs; anything else reverts, as Multicall3's dispatcher does.
func aggregate3(env execEnv, st *state, sender common.Address, value *big.Int, data []byte) callResult {
	base := intrinsicGas(data) + aggregateExecGas
	calls, ok := multicall3.DecodeAggregate3Calldata(data)
	if !ok || value != nil && value.Sign() > 0 {
		return callResult{reverted: true, gas: base}
	}
	work := st.copy()
	var (
		logs    []*types.Log
		commits []func(*state, common.Hash)
		results = make([]multicall3.Result, len(calls))
		gas     = base
	)
	for i, c := range calls {
		to := c.Target
		r := run(env, work, multicall3.Address, &to, nil, c.CallData)
		// The call's intrinsic cost is the lone transaction's, which the batch pays once.
		gas += r.gas - intrinsicGas(c.CallData) + aggregateCallGas
		if r.reverted {
			if !c.AllowFailure {
				return callResult{reverted: true, reason: "Multicall3: call failed", gas: gas}
			}
			results[i] = multicall3.Result{Success: false, ReturnData: revertData(r.reason)}
			continue
		}
		if r.commit != nil {
			r.commit(work, common.Hash{}) // the next calls see it; the batch's commit replays it
			commits = append(commits, r.commit)
		}
		logs = append(logs, r.logs...)
		results[i] = multicall3.Result{Success: true, ReturnData: r.ret}
	}
	return callResult{ret: multicall3.Aggregate3Answer(results), logs: logs, gas: gas, commit: func(st *state, tx common.Hash) {
		for _, c := range commits {
			c(st, tx)
		}
		// The calls' sender is Multicall3; a use's Sender is the transaction's.
		for _, l := range logs {
			if len(l.Topics) == 3 && (l.Topics[0] == eip3009.AuthorizationUsedTopic || l.Topics[0] == eip3009.AuthorizationCanceledTopic) {
				k := authKey{common.BytesToAddress(l.Topics[1][:]), l.Topics[2]}
				if u, ok := st.auths[k]; ok && u.TxHash == tx {
					u.Sender = sender
					st.auths[k] = u
				}
			}
		}
	}}
}

func tokenAnswer(method string, vals ...any) []byte {
	out, err := eip3009.EncodeAnswer(method, vals...)
	if err != nil {
		panic("settlesim: packing " + method + ": " + err.Error()) // a programming error
	}
	return out
}

// TokenCall is a decoded call of one of the token's authorization methods.
type TokenCall struct {
	Kind UseKind
	// Authorization is the transfer's; for a cancel only From (the authorizer) and Nonce are set.
	Authorization facilitator.Authorization
}

// DecodeTokenCall decodes transferWithAuthorization (either overload) and cancelAuthorization
// (either overload) calldata; ok is false for anything else.
func DecodeTokenCall(data []byte) (TokenCall, bool) {
	c, ok := eip3009.DecodeCall(data)
	switch {
	case ok && c.Method == eip3009.MethodTransferWithAuthorization:
		return TokenCall{Kind: UseTransfer, Authorization: c.Authorization}, true
	case ok && c.Method == eip3009.MethodCancelAuthorization:
		return TokenCall{Kind: UseCancel, Authorization: c.Authorization}, true
	}
	return TokenCall{}, false
}

// cancelCalldata encodes cancelAuthorization(authorizer, nonce, v, r, s). The chain does not
// check the signature, so any will do.
func cancelCalldata(authorizer common.Address, nonce [32]byte) []byte {
	sig := make([]byte, 65)
	sig[0], sig[32], sig[64] = 1, 1, 27
	return eip3009.CancelCalldata(authorizer, nonce, sig)
}

// revertData is the ABI encoding of Error(reason), which nodes return with a revert.
func revertData(reason string) []byte {
	if reason == "" {
		return nil
	}
	s, _ := abi.NewType("string", "", nil)
	enc, err := abi.Arguments{{Type: s}}.Pack(reason)
	if err != nil {
		panic(err)
	}
	return append(crypto.Keccak256([]byte("Error(string)"))[:4], enc...)
}
