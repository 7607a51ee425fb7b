package ledgercheck

import (
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The rule on hand-made evidence: each way the chain can contradict the row is a disagreement,
// missing evidence is never one, and a cancel log or another token's log is not a use.
func TestCheck(t *testing.T) {
	token, payer := common.HexToAddress("0x01"), common.HexToAddress("0x02")
	nonce := [32]byte{7}
	tx := common.HexToHash("0xaa")
	payee := common.HexToAddress("0x04")
	row := facilitator.Settlement{Key: facilitator.AuthorizationKey{Asset: token, Payer: payer, Nonce: nonce},
		State: facilitator.StateFinal, TxHash: tx, BlockNumber: 9, PayTo: payee, Value: big.NewInt(1000)}
	receipt := func(status uint64, logs ...*types.Log) *types.Receipt {
		return &types.Receipt{Status: status, TxHash: tx, BlockNumber: big.NewInt(9), Logs: logs}
	}
	// FiatToken marks the authorization used, then moves the value: the pair is the proof.
	use := eip3009.AuthorizationLog(token, payer, nonce, false)
	moved := eip3009.TransferLog(token, payer, payee, big.NewInt(1000))
	for name, tc := range map[string]struct {
		row  facilitator.Settlement
		ev   Evidence
		want Verdict
	}{
		"agrees":                     {row, Evidence{Receipt: receipt(1, use, moved), Used: true, UsedKnown: true}, Agrees},
		"no receipt":                 {row, Evidence{Used: true, UsedKnown: true}, Unreadable},
		"state unread":               {row, Evidence{Receipt: receipt(1, use, moved)}, Unreadable},
		"reverted":                   {row, Evidence{Receipt: receipt(0, use, moved), Used: true, UsedKnown: true}, Disagrees},
		"no use log":                 {row, Evidence{Receipt: receipt(1), Used: true, UsedKnown: true}, Disagrees},
		"a use without its transfer": {row, Evidence{Receipt: receipt(1, use), Used: true, UsedKnown: true}, Disagrees},
		"another payee":              {row, Evidence{Receipt: receipt(1, use, eip3009.TransferLog(token, payer, common.HexToAddress("0x05"), big.NewInt(1000))), Used: true, UsedKnown: true}, Disagrees},
		"another amount":             {row, Evidence{Receipt: receipt(1, use, eip3009.TransferLog(token, payer, payee, big.NewInt(999))), Used: true, UsedKnown: true}, Disagrees},
		"a cancel, not a use":        {row, Evidence{Receipt: receipt(1, eip3009.AuthorizationLog(token, payer, nonce, true)), Used: true, UsedKnown: true}, Disagrees},
		"another token's log":        {row, Evidence{Receipt: receipt(1, eip3009.AuthorizationLog(common.HexToAddress("0x03"), payer, nonce, false)), Used: true, UsedKnown: true}, Disagrees},
		"unused on chain":            {row, Evidence{Receipt: receipt(1, use, moved), UsedKnown: true}, Disagrees},
		"row not settled":            {facilitator.Settlement{Key: row.Key, State: facilitator.StateBroadcast}, Evidence{}, Disagrees},
	} {
		got, why := Check(tc.row, tc.ev)
		if got != tc.want || (got == Disagrees) != (len(why) > 0 && tc.want == Disagrees) {
			t.Errorf("%s: %s %v, want %s", name, got, why, tc.want)
		}
	}
}
