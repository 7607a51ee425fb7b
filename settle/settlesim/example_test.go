package settlesim_test

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
	"github.com/x402-facilitator/x402-facilitator/settle/settlesim"
)

// A driver builds everything from one seed: the clock, the chain, a few nodes with their own
// faults behind a load balancer (the engine's ethrpc.Chain), and the ledger (its Store).
func Example() {
	seed := uint64(42)
	r := rand.New(rand.NewPCG(seed, 0))
	clock := settlesim.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	chain := settlesim.NewChain(settlesim.ChainConfig{}, clock)
	nodes := []*settlesim.Backend{
		settlesim.NewBackend(chain, "steady", settlesim.Profile{}, r),
		settlesim.NewBackend(chain, "flaky", settlesim.RandomProfile(r), r),
	}
	var endpoint ethrpc.Chain = settlesim.NewBalancer(r, nodes...)
	ledger := settlesim.NewLedger(clock, settlesim.LedgerFaults{Fail: 0.05, Ambiguous: 0.05}, r)
	_ = ledger // the engine's Store (settle.Config's), as store_contract.go asserts

	signer, _ := crypto.ToECDSA(crypto.Keccak256([]byte("example signer")))
	payer := common.HexToAddress("0xbeef")
	chain.Fund(crypto.PubkeyToAddress(signer.PublicKey), big.NewInt(1e18))
	chain.Mint(payer, big.NewInt(1_000))

	// What the engine does: sign a transferWithAuthorization, broadcast it.
	a := facilitator.Authorization{From: payer, To: common.HexToAddress("0xcafe"), Value: big.NewInt(10),
		ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(clock.Now().Unix() + 600), Nonce: [32]byte{1}}
	token := chain.Token()
	tx, _ := types.SignNewTx(signer, chain.Signer(), &types.DynamicFeeTx{ChainID: big.NewInt(1337), Nonce: 0,
		GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(3e9), Gas: 120_000, To: &token,
		Data: eip3009.TransferCalldata(a, make([]byte, 65))})
	raw, _ := tx.MarshalBinary()
	_, _ = chain.SendRaw(raw) // or through endpoint, with its faults

	// The simulator moves the world on.
	clock.Advance(2 * time.Second)
	chain.Mine()
	_, _ = chain.Reorg(1, settlesim.ReorgConflictTransfer)

	// The oracle reads the truth directly.
	use, _ := chain.AuthorizationUse(payer, a.Nonce)
	rcpt, _ := chain.Receipt(tx.Hash())
	fmt.Println("used by a third party:", use.Sender == chain.ThirdParty(), "ours reverted:", rcpt.Status == 0)
	fmt.Println("paid:", chain.TokenBalance(a.To))

	var head hexutil.Uint64
	_ = endpoint.CallContext(context.Background(), &head, "eth_blockNumber")
	// Output:
	// used by a third party: true ours reverted: true
	// paid: 10
}
