package settle

import (
	"errors"
	"strings"

	"github.com/ethereum/go-ethereum/rpc"
)

// sendResult is what a node's answer to eth_sendRawTransaction means for the engine. The node
// answers in free text; it is classified here, once.
type sendResult int

const (
	// sentOK: the node accepted the transaction, or already had it.
	sentOK sendResult = iota
	// sendUnderpriced: a transaction with our nonce and higher fees is in the pool, or the fees are
	// below what the node takes: bump.
	sendUnderpriced
	// sendNonceUsed: our nonce is already used on chain. It is ambiguous (one of our own variants may
	// have been mined), so the watcher decides from receipts and authorizationState, never from this.
	sendNonceUsed
	// sendNoFunds: the signer cannot pay for gas. Nothing to do but alert and retry later.
	sendNoFunds
	// sendRetry: the node did not answer, or refused for a reason that may pass; try again later.
	sendRetry
)

func classifySend(err error) sendResult {
	if err == nil {
		return sentOK
	}
	var rpcErr rpc.Error
	if !errors.As(err, &rpcErr) {
		return sendRetry // transport: the node may or may not have it; resending is harmless
	}
	msg := strings.ToLower(err.Error())
	switch {
	case strings.Contains(msg, "already known"), strings.Contains(msg, "known transaction"),
		strings.Contains(msg, "already imported"), strings.Contains(msg, "already exists"):
		return sentOK
	case strings.Contains(msg, "nonce too low"), strings.Contains(msg, "nonce has already been used"),
		strings.Contains(msg, "nonce is too low"):
		return sendNonceUsed
	case strings.Contains(msg, "underpriced"), strings.Contains(msg, "fee too low"),
		strings.Contains(msg, "less than block base fee"), strings.Contains(msg, "max fee per gas less than"):
		return sendUnderpriced
	case strings.Contains(msg, "insufficient funds"):
		return sendNoFunds
	default:
		return sendRetry
	}
}
