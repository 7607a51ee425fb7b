package ethrpc

import (
	"context"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
)

// The JSON-RPC calls the services make, one constructor each: the method's name and its
// arguments in their wire form are spelled here and nowhere else. A constructor returns a batch
// element, because most reads go out in one batch with the head they are judged against (one
// node's answers); One sends an element alone. Where callers decode the same answer into views
// of their own (a block's hash, its timestamp, its transactions), the result stays theirs to
// give.

// At is the block parameter of block number n.
func At(n uint64) string { return hexutil.EncodeUint64(n) }

// BlockNumber reads the node's head (eth_blockNumber).
func BlockNumber(out *hexutil.Uint64) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_blockNumber", Result: out}
}

// Block reads the block at (a number from At, or a tag such as "latest") with its
// transactions' hashes, or their bodies when full (eth_getBlockByNumber). out is the caller's
// view of a block; a pointer to a pointer reads a missing block as nil.
func Block(at string, full bool, out any) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getBlockByNumber", Args: []any{at, full}, Result: out}
}

// TransactionCount reads how many transactions addr had sent as of block at
// (eth_getTransactionCount): the next nonce, counting the block's.
func TransactionCount(addr common.Address, at string, out *hexutil.Uint64) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getTransactionCount", Args: []any{addr, at}, Result: out}
}

// Balance reads addr's native balance at block at (eth_getBalance).
func Balance(addr common.Address, at string, out *hexutil.Big) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getBalance", Args: []any{addr, at}, Result: out}
}

// Code reads the code at addr as of block at (eth_getCode).
func Code(addr common.Address, at string, out *hexutil.Bytes) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getCode", Args: []any{addr, at}, Result: out}
}

// Call runs a read-only call (a transaction object: "to", "input", …) at block at, a block
// parameter or an object naming a block by hash (eth_call).
func Call(call map[string]any, at any, out *hexutil.Bytes) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_call", Args: []any{call, at}, Result: out}
}

// Logs reads the logs filter selects (eth_getLogs); out is the caller's slice of logs.
func Logs(filter map[string]any, out any) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getLogs", Args: []any{filter}, Result: out}
}

// TransactionReceipt reads tx's receipt, null while the node has it in no block
// (eth_getTransactionReceipt); out points to the caller's receipt pointer.
func TransactionReceipt(tx common.Hash, out any) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getTransactionReceipt", Args: []any{tx}, Result: out}
}

// TransactionByHash reads the transaction tx, signature included, null when the node does not
// know it (eth_getTransactionByHash); out points to the caller's *types.Transaction.
func TransactionByHash(tx common.Hash, out any) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getTransactionByHash", Args: []any{tx}, Result: out}
}

// BlockReceipts reads every receipt of the block at (eth_getBlockReceipts), which not every
// node serves.
func BlockReceipts(at string, out *[]*Receipt) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_getBlockReceipts", Args: []any{at}, Result: out}
}

// SendRawTransaction sends a signed transaction (eth_sendRawTransaction); out gets its hash.
func SendRawTransaction(raw []byte, out *common.Hash) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_sendRawTransaction", Args: []any{hexutil.Bytes(raw)}, Result: out}
}

// GasPrice reads the node's gas price for a legacy transaction (eth_gasPrice).
func GasPrice(out *hexutil.Big) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_gasPrice", Result: out}
}

// MaxPriorityFeePerGas reads the node's suggested tip (eth_maxPriorityFeePerGas).
func MaxPriorityFeePerGas(out *hexutil.Big) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_maxPriorityFeePerGas", Result: out}
}

// FeeHistory reads the base fees and the tips at percentiles of the blocks blocks up to newest
// (eth_feeHistory); out is the caller's view of the answer.
func FeeHistory(blocks uint64, newest string, percentiles []float64, out any) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_feeHistory", Args: []any{hexutil.Uint64(blocks), newest, percentiles}, Result: out}
}

// ChainID reads the chain's id (eth_chainId).
func ChainID(out *hexutil.Uint64) rpc.BatchElem {
	return rpc.BatchElem{Method: "eth_chainId", Result: out}
}

// Caller sends one call.
type Caller interface {
	CallContext(ctx context.Context, result any, method string, args ...any) error
}

// One sends el alone, as a call rather than a batch of one.
func One(ctx context.Context, c Caller, el rpc.BatchElem) error {
	return c.CallContext(ctx, el.Result, el.Method, el.Args...)
}
