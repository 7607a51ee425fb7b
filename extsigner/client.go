// Package extsigner is signing with keys that live outside the facilitator, over go-ethereum
// Clef's external signer API (account_list, account_signTransaction on HTTP JSON-RPC): the client
// the settlement engine signs through, and the narrow signer of our own (`facilitator signer`)
// that holds the keys and signs nothing but settlements.
package extsigner

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"
)

// Endpoint is one remote signer: the JSON-RPC connection and where it is, without credentials.
type Endpoint struct {
	rpc     *rpc.Client
	where   string
	chainID *big.Int
	now     func() time.Time
	health  health
}

// Dial prepares the signer at rawURL (http or https; user:password in it is sent as basic auth)
// for chain chainID. Nothing is sent yet. Errors never carry the URL's credentials, path or query.
func Dial(ctx context.Context, rawURL string, chainID uint64) (*Endpoint, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("remote signer URL %q is not an http(s) URL", Redact(rawURL))
	}
	// Every call has its own deadline (the caller's context); this bounds one that has none.
	hc := &http.Client{Timeout: time.Minute}
	c, err := rpc.DialOptions(ctx, rawURL, rpc.WithHTTPClient(hc))
	if err != nil {
		return nil, fmt.Errorf("remote signer %s: %s", Redact(rawURL), scrub(err))
	}
	return &Endpoint{rpc: c, where: Redact(rawURL), chainID: new(big.Int).SetUint64(chainID), now: time.Now}, nil
}

// Close closes the connection.
func (e *Endpoint) Close() { e.rpc.Close() }

// String is where the signer is, without credentials.
func (e *Endpoint) String() string { return e.where }

// Accounts is account_list: the addresses the signer holds keys of (a Clef with rules must
// approve listing).
func (e *Endpoint) Accounts(ctx context.Context) ([]common.Address, error) {
	var out []common.Address
	if err := e.rpc.CallContext(ctx, &out, "account_list"); err != nil {
		return nil, fmt.Errorf("remote signer %s: account_list: %s", e.where, scrub(err))
	}
	return out, nil
}

// Signer is the remote key of addr; its health is listed from now on (Health).
func (e *Endpoint) Signer(addr common.Address) *Client {
	e.health.mu.Lock()
	e.health.key(addr)
	e.health.mu.Unlock()
	return &Client{e: e, addr: addr}
}

// Client signs one remote key's transactions (settle.Signer).
type Client struct {
	e    *Endpoint
	addr common.Address
}

// Address is the key's account.
func (c *Client) Address() common.Address { return c.addr }

// signResult is account_signTransaction's answer (Clef's SignTransactionResult).
type signResult struct {
	Raw hexutil.Bytes `json:"raw"`
}

// SignTx asks the signer to sign tx (ChainID is set to the endpoint's) and returns the signed
// transaction it answers. The caller checks that it is the transaction asked for. The answer is
// recorded in the key's health; an error is a *SignError.
func (c *Client) SignTx(ctx context.Context, tx types.TxData) (*types.Transaction, error) {
	signed, err := c.signTx(ctx, tx)
	c.e.record(c.addr, err, true)
	if err != nil {
		return nil, err
	}
	return signed, nil
}

func (c *Client) signTx(ctx context.Context, tx types.TxData) (*types.Transaction, *SignError) {
	args := Args(c.addr, c.e.chainID, tx)
	var res signResult
	if err := c.e.rpc.CallContext(ctx, &res, "account_signTransaction", args); err != nil {
		return nil, c.e.signError("account_signTransaction", err)
	}
	signed := new(types.Transaction)
	if err := signed.UnmarshalBinary(res.Raw); err != nil {
		return nil, &SignError{Reason: ReasonBadAnswer, msg: fmt.Sprintf("remote signer %s: the signed transaction does not decode: %v", c.e.where, err)}
	}
	return signed, nil
}

// Args is tx (a dynamic-fee or a legacy transaction) as account_signTransaction's arguments, from
// from on chain chainID.
func Args(from common.Address, chainID *big.Int, tx types.TxData) apitypes.SendTxArgs {
	t := types.NewTx(tx)
	data := hexutil.Bytes(t.Data())
	args := apitypes.SendTxArgs{
		From:    common.NewMixedcaseAddress(from),
		Gas:     hexutil.Uint64(t.Gas()),
		Nonce:   hexutil.Uint64(t.Nonce()),
		Input:   &data,
		ChainID: (*hexutil.Big)(chainID),
	}
	if t.Type() == types.LegacyTxType {
		args.GasPrice = (*hexutil.Big)(t.GasPrice())
	} else {
		args.MaxFeePerGas, args.MaxPriorityFeePerGas = (*hexutil.Big)(t.GasFeeCap()), (*hexutil.Big)(t.GasTipCap())
	}
	if t.Value() != nil {
		args.Value = hexutil.Big(*t.Value())
	}
	if t.To() != nil {
		to := common.NewMixedcaseAddress(*t.To())
		args.To = &to
	}
	return args
}

// Redact is rawURL as it may be shown: scheme and host only (no user, password, path or query,
// any of which can hold a credential).
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "(unparsable URL)"
	}
	return u.Scheme + "://" + u.Host
}

// scrub is err's text without the request URL the HTTP client puts in transport errors.
func scrub(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return strings.TrimSpace(ue.Op + ": " + ue.Err.Error())
	}
	return err.Error()
}
