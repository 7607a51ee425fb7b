package settlesim

import (
	"context"
	"fmt"
	"net/url"
	"syscall"

	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/rpc"
)

// RPCError is a JSON-RPC error object as go-ethereum's client decodes one: it satisfies
// rpc.Error and rpc.DataError, and its text is the message alone, so code that classifies node
// errors by message (settle's classifySend, verify's isExecutionError) sees what it would see
// from a real node.
type RPCError struct {
	Code    int
	Message string
	Data    any
}

func (e *RPCError) Error() string {
	if e == nil {
		return "<nil>"
	}
	if e.Message == "" {
		return fmt.Sprintf("json-rpc error %d", e.Code)
	}
	return e.Message
}

func (e *RPCError) ErrorCode() int          { return e.Code }
func (e *RPCError) ErrorData() any          { return e.Data }
func (e *RPCError) String() string          { return fmt.Sprintf("%d %s", e.Code, e.Message) }
func rpcErr(code int, msg string) *RPCError { return &RPCError{Code: code, Message: msg} }

var (
	_ rpc.Error     = (*RPCError)(nil)
	_ rpc.DataError = (*RPCError)(nil)
)

// Error codes and messages real nodes answer with.
const (
	codeDefault       = -32000 // geth's code for any error without its own
	codeInvalidParams = -32602
	codeNotFound      = -32601
	codeInternal      = -32603
	codeLimit         = -32005 // Infura's and others' rate limit
	codeRevert        = 3      // geth's execution reverted
)

func errHeaderNotFound() *RPCError { return rpcErr(codeDefault, "header not found") }
func errHashNotFound() *RPCError   { return rpcErr(codeDefault, "header for hash not found") }
func errNotCanonical() *RPCError   { return rpcErr(codeDefault, "hash is not currently canonical") }
func errMethod(method string) *RPCError {
	return rpcErr(codeNotFound, fmt.Sprintf("the method %s does not exist/is not available", method))
}
func errParam(i int, err error) *RPCError {
	return rpcErr(codeInvalidParams, fmt.Sprintf("invalid argument %d: %v", i, err))
}
func errMissingParam(i int) *RPCError {
	return rpcErr(codeInvalidParams, fmt.Sprintf("missing value for required argument %d", i))
}

// errRevert is geth's answer to an eth_call or eth_estimateGas that reverts: code 3, the reason
// in the message, the ABI-encoded Error(string) as data.
func errRevert(reason string) *RPCError {
	if reason == "" {
		return &RPCError{Code: codeRevert, Message: "execution reverted"}
	}
	return &RPCError{Code: codeRevert, Message: "execution reverted: " + reason, Data: hexutil.Encode(revertData(reason))}
}

// Transport errors, shaped as go-ethereum's HTTP client returns them: a *url.Error for what
// never got an answer, an rpc.HTTPError for a non-2xx status. Neither is an rpc.Error, so the
// engine reads them as "the node may or may not have it".
func errTimeout(u string) error {
	return &url.Error{Op: "Post", URL: u, Err: context.DeadlineExceeded}
}

func errReset(u string) error { return &url.Error{Op: "Post", URL: u, Err: syscall.ECONNRESET} }

func errHTTP(code int) error {
	switch code {
	case 429:
		return rpc.HTTPError{StatusCode: 429, Status: "429 Too Many Requests",
			Body: []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":429,"message":"Too Many Requests"}}`)}
	case 502:
		return rpc.HTTPError{StatusCode: 502, Status: "502 Bad Gateway", Body: []byte("upstream connect error")}
	default:
		return rpc.HTTPError{StatusCode: 503, Status: "503 Service Unavailable", Body: []byte("no healthy upstream")}
	}
}
