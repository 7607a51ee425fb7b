package settlesim

import (
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The token's ABI: the FiatToken V2.2 methods the engine, verify and the simulator's third
// parties call. Parsed once, never written.
var tokenABI = func() abi.ABI {
	a, err := abi.JSON(strings.NewReader(`[
	{"type":"function","name":"transferWithAuthorization","inputs":[
		{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},
		{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"},
		{"name":"v","type":"uint8"},{"name":"r","type":"bytes32"},{"name":"s","type":"bytes32"}],"outputs":[]},
	{"type":"function","name":"transferWithAuthorization","inputs":[
		{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},
		{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"},
		{"name":"signature","type":"bytes"}],"outputs":[]},
	{"type":"function","name":"cancelAuthorization","inputs":[
		{"name":"authorizer","type":"address"},{"name":"nonce","type":"bytes32"},
		{"name":"v","type":"uint8"},{"name":"r","type":"bytes32"},{"name":"s","type":"bytes32"}],"outputs":[]},
	{"type":"function","name":"cancelAuthorization","inputs":[
		{"name":"authorizer","type":"address"},{"name":"nonce","type":"bytes32"},{"name":"signature","type":"bytes"}],"outputs":[]},
	{"type":"function","name":"authorizationState","stateMutability":"view","inputs":[
		{"name":"authorizer","type":"address"},{"name":"nonce","type":"bytes32"}],"outputs":[{"name":"","type":"bool"}]},
	{"type":"function","name":"balanceOf","stateMutability":"view","inputs":[{"name":"account","type":"address"}],"outputs":[{"name":"","type":"uint256"}]},
	{"type":"function","name":"transfer","inputs":[{"name":"to","type":"address"},{"name":"value","type":"uint256"}],"outputs":[{"name":"","type":"bool"}]},
	{"type":"function","name":"name","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"string"}]},
	{"type":"function","name":"version","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"string"}]},
	{"type":"function","name":"decimals","stateMutability":"view","inputs":[],"outputs":[{"name":"","type":"uint8"}]}
	]`))
	if err != nil {
		panic(err)
	}
	return a
}()

// The token's event topics, as FiatToken emits them.
var (
	TransferTopic              = crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))
	AuthorizationUsedTopic     = crypto.Keccak256Hash([]byte("AuthorizationUsed(address,bytes32)"))
	AuthorizationCanceledTopic = crypto.Keccak256Hash([]byte("AuthorizationCanceled(address,bytes32)"))
)

// FiatToken's revert strings: verify and the engine read them only through "execution
// reverted", but a driver comparing diagnoses wants the real ones.
const (
	revertNotYetValid = "FiatTokenV2: authorization is not yet valid"
	revertExpired     = "FiatTokenV2: authorization is expired"
	revertUsed        = "FiatTokenV2: authorization is used or canceled"
	revertBalance     = "ERC20: transfer amount exceeds balance"
	revertZeroAddress = "ERC20: transfer to the zero address"
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
)

// tokenCode is what eth_getCode answers for the token: any non-empty code tells verify that the
// asset is deployed.
var tokenCode = common.FromHex("0x608060405234801561001057600080fd5b50")

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
}

func newState() *state {
	return &state{nonces: map[common.Address]uint64{}, eth: map[common.Address]*big.Int{},
		usdc: map[common.Address]*big.Int{}, auths: map[authKey]Use{}}
}

func (s *state) copy() *state {
	out := &state{nonces: make(map[common.Address]uint64, len(s.nonces)), eth: make(map[common.Address]*big.Int, len(s.eth)),
		usdc: make(map[common.Address]*big.Int, len(s.usdc)), auths: make(map[authKey]Use, len(s.auths))}
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
	number  uint64
	time    uint64
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
	m, err := tokenABI.MethodById(data[:4])
	if err != nil {
		return revert(revertUnknown)
	}
	args, err := m.Inputs.Unpack(data[4:])
	if err != nil {
		return revert(revertUnknown)
	}
	switch m.RawName {
	case "transferWithAuthorization":
		a := authorizationOf(args)
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
		// The EIP-712 signature is not checked: verify checks it before anything is signed, and
		// the simulator's third parties submit copies of signed calldata.
		if a.To == (common.Address{}) {
			return revert(revertZeroAddress)
		}
		if st.tokens(a.From).Cmp(a.Value) < 0 {
			return revert(revertBalance)
		}
		logs := []*types.Log{
			{Address: env.token, Topics: []common.Hash{AuthorizationUsedTopic, addressTopic(a.From), a.Nonce}, Data: []byte{}},
			{Address: env.token, Topics: []common.Hash{TransferTopic, addressTopic(a.From), addressTopic(a.To)}, Data: common.LeftPadBytes(a.Value.Bytes(), 32)},
		}
		return callResult{ret: []byte{}, logs: logs, gas: base + transferExecGas, commit: func(st *state, tx common.Hash) {
			st.auths[key] = Use{Kind: UseTransfer, TxHash: tx, Sender: sender, BlockNumber: env.number, To: a.To, Value: new(big.Int).Set(a.Value)}
			st.usdc[a.From] = new(big.Int).Sub(st.tokens(a.From), a.Value)
			st.usdc[a.To] = new(big.Int).Add(st.tokens(a.To), a.Value)
		}}
	case "cancelAuthorization":
		key := authKey{args[0].(common.Address), args[1].([32]byte)}
		if _, used := st.auths[key]; used {
			return revert(revertUsed)
		}
		logs := []*types.Log{{Address: env.token, Topics: []common.Hash{AuthorizationCanceledTopic, addressTopic(key.authorizer), key.nonce}, Data: []byte{}}}
		return callResult{ret: []byte{}, logs: logs, gas: base + cancelExecGas, commit: func(st *state, tx common.Hash) {
			st.auths[key] = Use{Kind: UseCancel, TxHash: tx, Sender: sender, BlockNumber: env.number, Value: new(big.Int)}
		}}
	case "transfer":
		dst, v := args[0].(common.Address), args[1].(*big.Int)
		if dst == (common.Address{}) {
			return revert(revertZeroAddress)
		}
		if st.tokens(sender).Cmp(v) < 0 {
			return revert(revertBalance)
		}
		logs := []*types.Log{{Address: env.token, Topics: []common.Hash{TransferTopic, addressTopic(sender), addressTopic(dst)}, Data: common.LeftPadBytes(v.Bytes(), 32)}}
		return callResult{ret: common.LeftPadBytes([]byte{1}, 32), logs: logs, gas: base + erc20ExecGas, commit: func(st *state, _ common.Hash) {
			st.usdc[sender] = new(big.Int).Sub(st.tokens(sender), v)
			st.usdc[dst] = new(big.Int).Add(st.tokens(dst), v)
		}}
	case "authorizationState":
		_, used := st.auths[authKey{args[0].(common.Address), args[1].([32]byte)}]
		return callResult{ret: mustPack(m, used), gas: base + viewExecGas}
	case "balanceOf":
		return callResult{ret: mustPack(m, new(big.Int).Set(st.tokens(args[0].(common.Address)))), gas: base + viewExecGas}
	case "name":
		return callResult{ret: mustPack(m, env.name), gas: base + viewExecGas}
	case "version":
		return callResult{ret: mustPack(m, env.version), gas: base + viewExecGas}
	case "decimals":
		return callResult{ret: mustPack(m, uint8(6)), gas: base + viewExecGas}
	}
	return revert(revertUnknown)
}

func mustPack(m *abi.Method, vals ...any) []byte {
	out, err := m.Outputs.Pack(vals...)
	if err != nil {
		panic("settlesim: packing " + m.Name + ": " + err.Error()) // a programming error
	}
	return out
}

func addressTopic(a common.Address) common.Hash { return common.BytesToHash(a[:]) }

func authorizationOf(args []any) facilitator.Authorization {
	return facilitator.Authorization{From: args[0].(common.Address), To: args[1].(common.Address), Value: args[2].(*big.Int),
		ValidAfter: args[3].(*big.Int), ValidBefore: args[4].(*big.Int), Nonce: args[5].([32]byte)}
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
	if len(data) < 4 {
		return TokenCall{}, false
	}
	m, err := tokenABI.MethodById(data[:4])
	if err != nil {
		return TokenCall{}, false
	}
	args, err := m.Inputs.Unpack(data[4:])
	if err != nil {
		return TokenCall{}, false
	}
	switch m.RawName {
	case "transferWithAuthorization":
		return TokenCall{Kind: UseTransfer, Authorization: authorizationOf(args)}, true
	case "cancelAuthorization":
		return TokenCall{Kind: UseCancel, Authorization: facilitator.Authorization{From: args[0].(common.Address), Nonce: args[1].([32]byte)}}, true
	}
	return TokenCall{}, false
}

// CancelCalldata encodes cancelAuthorization(authorizer, nonce, v, r, s). The chain does not
// check the signature, so any will do.
func CancelCalldata(authorizer common.Address, nonce [32]byte) []byte {
	data, err := tokenABI.Pack("cancelAuthorization", authorizer, nonce, uint8(27), [32]byte{1}, [32]byte{1})
	if err != nil {
		panic(err)
	}
	return data
}

// TokenTransferCalldata encodes the ERC-20 transfer(to, value).
func TokenTransferCalldata(to common.Address, value *big.Int) []byte {
	data, err := tokenABI.Pack("transfer", to, value)
	if err != nil {
		panic(err)
	}
	return data
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
