package ethrpc

import (
	"context"
	"errors"
	"fmt"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
)

// ErrUnknownTx: the node answered that it does not know the transaction.
var ErrUnknownTx = errors.New("ethrpc: the node does not know the transaction")

// SignedTx reads the transaction hash from c and returns it with its sender. The sender is not
// the node's word: the transaction is re-hashed and must be hash, and the sender is recovered
// from its signature. So no node can make a transaction look sent by a key that did not sign it;
// one can only withhold it (ErrUnknownTx, or an error).
func SignedTx(ctx context.Context, c Caller, hash common.Hash) (*types.Transaction, common.Address, error) {
	var tx *types.Transaction
	if err := One(ctx, c, TransactionByHash(hash, &tx)); err != nil {
		return nil, common.Address{}, err
	}
	if tx == nil {
		return nil, common.Address{}, ErrUnknownTx
	}
	return Verified(tx, hash)
}

// Verified returns tx with its sender, recovered from its signature, once tx is the
// transaction hash names.
func Verified(tx *types.Transaction, hash common.Hash) (*types.Transaction, common.Address, error) {
	if tx.Hash() != hash {
		return nil, common.Address{}, fmt.Errorf("ethrpc: the node answered transaction %s for %s", tx.Hash(), hash)
	}
	from, err := types.Sender(types.LatestSignerForChainID(tx.ChainId()), tx)
	if err != nil {
		return nil, common.Address{}, fmt.Errorf("ethrpc: recovering the sender of %s: %w", hash, err)
	}
	return tx, from, nil
}
