package ethrpc

import (
	"context"
	"crypto/ecdsa"
	"fmt"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
)

// Signer signs EIP-1559 transactions of one key for one chain. Every transaction the facilitator
// and its tools send is built here, so a replacement, a re-sign and a first send of the same
// calldata differ only in what their callers chose (nonce, fees), never in how they are encoded.
type Signer struct {
	key     *ecdsa.PrivateKey
	addr    common.Address
	chainID *big.Int
	signer  types.Signer
}

// NewSigner returns the signer of key on chain chainID.
func NewSigner(chainID uint64, key *ecdsa.PrivateKey) *Signer {
	id := new(big.Int).SetUint64(chainID)
	return &Signer{key: key, addr: crypto.PubkeyToAddress(key.PublicKey), chainID: id, signer: types.LatestSignerForChainID(id)}
}

// Address is the key's account.
func (s *Signer) Address() common.Address { return s.addr }

// Sign builds and signs a dynamic-fee transaction; to == nil deploys data as code.
func (s *Signer) Sign(nonce uint64, to *common.Address, data []byte, gas uint64, tipCap, feeCap *big.Int) (*types.Transaction, error) {
	return s.SignTx(context.Background(), &types.DynamicFeeTx{
		Nonce:     nonce,
		GasTipCap: tipCap,
		GasFeeCap: feeCap,
		Gas:       gas,
		To:        to,
		Data:      data,
	})
}

// SignTx signs tx, a dynamic-fee (its ChainID is set here) or a legacy transaction (EIP-155
// replay protected), for the signer's chain. The key is in the process, so ctx bounds nothing;
// it is there because the settlement engine signs through an interface a remote signer also
// implements.
func (s *Signer) SignTx(_ context.Context, tx types.TxData) (*types.Transaction, error) {
	switch t := tx.(type) {
	case *types.DynamicFeeTx:
		c := *t
		c.ChainID = s.chainID
		return types.SignNewTx(s.key, s.signer, &c)
	case *types.LegacyTx:
		c := *t
		return types.SignNewTx(s.key, s.signer, &c)
	default:
		return nil, fmt.Errorf("ethrpc: cannot sign a transaction of type %T", tx)
	}
}
