package settle

import (
	"context"
	"fmt"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Signer signs one key's transactions on one network. The key may be in the process
// (ethrpc.Signer) or outside it (extsigner.Client: a Clef external signer, or our narrow
// `facilitator signer`), where signing is a network call that can fail, time out or be refused.
// The engine treats every failure alike: nothing was signed, so nothing is committed and nothing
// is sent (a first send answers 503; a bump or a re-sign is tried again later).
type Signer interface {
	// Address is the key's account: the engine leases, counts and funds keys by it.
	Address() common.Address
	// SignTx signs tx, a *types.DynamicFeeTx (the signer sets its ChainID) or, on a network
	// priced the legacy way, a *types.LegacyTx (EIP-155 replay protected), for the network's chain.
	SignTx(ctx context.Context, tx types.TxData) (*types.Transaction, error)
}

// signed is a transaction signed by a sender's key, with the bytes the ledger records.
type signed struct {
	tx  *types.Transaction
	raw []byte
}

// sign signs a call of the key's, bounded by SignTimeout, and checks that what came back is what
// was asked for, from this key: a remote signer's answer is committed and broadcast as it is, so
// one that changed a field (or signed with another key) must not get in. ctx may carry no
// cancellation (a group commit's), hence the bound.
func (s *sender) sign(ctx context.Context, nonce uint64, to common.Address, data []byte, gas uint64, fees Fees) (signed, error) {
	e := s.net.engine
	// On a legacy network the fee cap is the gas price (settle/fees.go prices it so).
	var want types.TxData = &types.DynamicFeeTx{Nonce: nonce, GasTipCap: fees.TipCap, GasFeeCap: fees.FeeCap, Gas: gas, To: &to, Data: data}
	if s.net.feePolicy.Legacy {
		want = &types.LegacyTx{Nonce: nonce, GasPrice: fees.FeeCap, Gas: gas, To: &to, Data: data}
	}
	sctx, cancel := context.WithTimeout(ctx, e.cfg.SignTimeout)
	tx, err := s.signer.SignTx(sctx, want)
	cancel()
	if err == nil {
		err = s.checkSigned(tx, want)
	}
	var raw []byte
	if err == nil {
		raw, err = tx.MarshalBinary()
	}
	if err != nil {
		return signed{}, signerDown(s, err)
	}
	return signed{tx: tx, raw: raw}, nil
}

// checkSigned holds a signed transaction to the one asked for.
func (s *sender) checkSigned(tx *types.Transaction, want types.TxData) error {
	chainID := new(big.Int).SetUint64(s.net.net.ChainID)
	asked := types.NewTx(want)
	switch {
	case tx == nil:
		return fmt.Errorf("the signer returned no transaction")
	case tx.Type() != asked.Type() || tx.ChainId().Cmp(chainID) != 0 || tx.Nonce() != asked.Nonce() ||
		tx.To() == nil || *tx.To() != *asked.To() || tx.Gas() != asked.Gas() || tx.Value().Sign() != 0 ||
		tx.GasTipCap().Cmp(asked.GasTipCap()) != 0 || tx.GasFeeCap().Cmp(asked.GasFeeCap()) != 0 ||
		string(tx.Data()) != string(asked.Data()) || len(tx.AccessList()) != 0:
		return fmt.Errorf("the signer returned a transaction other than the one asked for (%s)", tx.Hash())
	}
	if _, inProcess := s.signer.(*ethrpc.Signer); inProcess {
		// The key is in this process and s.addr is derived from it (ethrpc.NewSigner), so what it
		// signed is from s.addr by construction: recovering the sender would be one more ecrecover
		// per transaction (a third of a settlement's signature work) that proves nothing. Any other
		// Signer, a wrapper of this one included, is checked below.
		return nil
	}
	from, err := types.Sender(types.LatestSignerForChainID(chainID), tx)
	if err != nil {
		return fmt.Errorf("the signed transaction's signature: %w", err)
	}
	if from != s.addr {
		return fmt.Errorf("the signer signed with %s, not %s", from, s.addr)
	}
	return nil
}

// signerDown is a signing failure as the caller of /settle sees it: the signer's fault, not the
// payment's, and nothing was sent. The cause (which may name the signer's host) stays in the logs.
func signerDown(s *sender, err error) error {
	return facilitator.Unavailable(facilitator.ReasonSignerUnavailable,
		"the transaction signer did not sign the settlement; nothing was sent, retry", fmt.Errorf("signer %s: %w", s.addr, err))
}
