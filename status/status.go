// Package status answers "what happened to this authorization?" from the ledger, the block index,
// and, when neither knows it, the chain itself, so that no one has to settle again to find out.
package status

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/x402-facilitator/x402-facilitator/eip3009"
	"github.com/x402-facilitator/x402-facilitator/ethrpc"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Store is what status reads from Postgres.
type Store interface {
	SettlementByKey(ctx context.Context, key facilitator.AuthorizationKey) (*facilitator.Settlement, error)
	SettlementByTx(ctx context.Context, tx common.Hash) (*facilitator.Settlement, error)
	// BatchMembers lists the settlements sharing the transaction at a signer's tx nonce, in the
	// batch's order (one for a lone settlement).
	BatchMembers(ctx context.Context, network string, signer common.Address, txNonce uint64) ([]facilitator.Settlement, error)
	PaymentID(ctx context.Context, scope, id string) (*facilitator.PaymentIDRecord, error)
	AuthorizationUse(ctx context.Context, network string, token, authorizer common.Address, nonce [32]byte) (*facilitator.AuthorizationUse, error)
	Cursor(ctx context.Context, network string) (facilitator.Block, bool, error)
	// SettlementEvents lists a settlement's events after the id after with one of states, oldest first.
	SettlementEvents(ctx context.Context, settlementID, after int64, states []string, limit int) ([]facilitator.SettlementEvent, error)
}

// Deliveries reads what merchants recorded they delivered for settlements (postgres.DB). It is
// not part of Store: a Store that also reads them (the Postgres ledger) is used for them, so every
// status answer over the ledger carries the record without each caller wiring it, and a Store
// that keeps none (the simulator's ledger, whose merchants record nothing) need not pretend to.
type Deliveries interface {
	// DeliveryRecord returns a settlement's record, nil when none was attached.
	DeliveryRecord(ctx context.Context, settlementID int64) (*facilitator.DeliveryRecord, error)
}

// Head reads the chain: its head and finality tag (in one request), recent logs.
type Head interface {
	CallContext(ctx context.Context, result any, method string, args ...any) error
	BatchCallContext(ctx context.Context, b []rpc.BatchElem) error
}

// Network is one chain status answers for; its finality rule is Network.Finality.
type Network struct {
	Network facilitator.Network
	Head    Head
	// Timeout bounds each request to the chain (default 5 s).
	Timeout time.Duration
	// Signers are the network's signer keys' addresses: a use by a transaction one of them
	// signed is the facilitator's, though the ledger has no row of it (it lost its newest
	// commits: a failover, a restore; the reconcile job adopts it).
	Signers []common.Address
}

// Service answers status queries.
type Service struct {
	store      Store
	deliveries Deliveries // nil: the store keeps no delivery records
	networks   map[string]Network
	// floors is each network's highest tagged final block answered consistently: a lower answer
	// is a node gone backwards, and says nothing.
	floors map[string]*facilitator.FinalityFloor
	now    func() time.Time
}

// New builds the service.
func New(store Store, networks []Network, now func() time.Time) *Service {
	s := &Service{store: store, networks: map[string]Network{}, floors: map[string]*facilitator.FinalityFloor{}, now: now}
	if s.now == nil {
		s.now = time.Now
	}
	s.deliveries, _ = store.(Deliveries)
	for _, n := range networks {
		if n.Timeout <= 0 {
			n.Timeout = 5 * time.Second
		}
		s.networks[n.Network.ID] = n
		s.floors[n.Network.ID] = new(facilitator.FinalityFloor)
	}
	return s
}

// Authorization answers for one authorization. found is false when neither the ledger nor the
// index has seen it; the answer then still carries the chain's word (unused or used).
func (s *Service) Authorization(ctx context.Context, key facilitator.AuthorizationKey) (st facilitator.AuthorizationStatus, found bool, err error) {
	return s.authorization(ctx, key, false)
}

// authorization answers for one authorization; public reads the ledger only as the public view
// may (public.go).
func (s *Service) authorization(ctx context.Context, key facilitator.AuthorizationKey, public bool) (st facilitator.AuthorizationStatus, found bool, err error) {
	n, ok := s.networks[key.Network]
	if !ok {
		return st, false, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork, "network %q is not served here", key.Network)
	}
	st = facilitator.AuthorizationStatus{Network: key.Network, Asset: key.Asset.Hex(), Authorizer: key.Payer.Hex(), Nonce: hexutil.Encode(key.Nonce[:])}
	if err := s.heads(ctx, n, &st); err != nil {
		return st, false, err
	}
	row, err := s.store.SettlementByKey(ctx, key)
	if err == nil {
		row, err = s.readable(ctx, row, public)
	}
	switch {
	case err == nil && row != nil:
		return s.fromLedger(ctx, n, st, row)
	case err != nil && !errors.Is(err, facilitator.ErrNotFound):
		return st, false, unavailable(err)
	}
	if found, err := s.fromIndex(ctx, n, &st, key); err != nil || found {
		return st, found, err
	}
	return s.fromChain(ctx, n, st, key)
}

// Payment answers for a payment-identifier id.
func (s *Service) Payment(ctx context.Context, scope, id string) (facilitator.AuthorizationStatus, error) {
	rec, err := s.store.PaymentID(ctx, scope, id)
	if errors.Is(err, facilitator.ErrNotFound) {
		return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
	}
	if err != nil {
		return facilitator.AuthorizationStatus{}, unavailable(err)
	}
	st, _, err := s.Authorization(ctx, rec.Settlement.Key)
	st.PaymentID = id
	return st, err
}

// Settlement answers for one of our transactions (any fee-bump variant). A batch's transaction
// is answered with its first settlement's status and the list of all of its settlements, each
// with its own status path.
func (s *Service) Settlement(ctx context.Context, tx common.Hash) (facilitator.AuthorizationStatus, error) {
	return s.settlement(ctx, tx, false)
}

// settlement answers for one of our transactions; public: as the public view may (public.go),
// not found until the transaction left us.
func (s *Service) settlement(ctx context.Context, tx common.Hash, public bool) (facilitator.AuthorizationStatus, error) {
	row, err := s.store.SettlementByTx(ctx, tx)
	if err == nil {
		row, err = s.readable(ctx, row, public)
	}
	if errors.Is(err, facilitator.ErrNotFound) || err == nil && row == nil {
		return facilitator.AuthorizationStatus{}, facilitator.ErrNotFound
	}
	if err != nil {
		return facilitator.AuthorizationStatus{}, unavailable(err)
	}
	st, _, err := s.authorization(ctx, row.Key, public)
	if err != nil {
		return st, err
	}
	members, err := s.store.BatchMembers(ctx, row.Key.Network, row.Signer, row.TxNonce)
	if err != nil {
		return st, unavailable(err)
	}
	if len(members) > 1 {
		for _, m := range members {
			nonce := hexutil.Encode(m.Key.Nonce[:])
			st.Batch = append(st.Batch, facilitator.BatchSettlement{Network: m.Key.Network, Asset: m.Key.Asset.Hex(), Authorizer: m.Key.Payer.Hex(),
				Nonce: nonce, State: facilitator.LedgerStatus(m.State), Reason: m.ErrorReason,
				Status: AuthorizationPath(m.Key.Network, m.Key.Asset.Hex(), m.Key.Payer.Hex(), nonce)})
		}
	}
	return st, nil
}

// AuthorizationPath is the path of an authorization's status answer.
func AuthorizationPath(network, asset, authorizer, nonce string) string {
	return "/v1/authorizations/" + url.PathEscape(network) + "/" + asset + "/" + authorizer + "/" + nonce
}

// TimelineLimit bounds a timeline: a settlement has a handful of events (signed, broadcast, a few
// fee bumps, mined, final, a reorg's way back), so more than this is a bumping loop worth no more rows.
const TimelineLimit = 100

// timelineStates are every state a settlement event records, fee bumps included: the timeline
// shows a settlement's whole life, not only what webhooks announce.
var timelineStates = []string{
	string(facilitator.StateSigned), string(facilitator.StateBroadcast), "bumped",
	string(facilitator.StateMined), string(facilitator.StateFinal), string(facilitator.StateReverted),
	string(facilitator.StateExpired), string(facilitator.StateSettledElsewhere), string(facilitator.StateCanceled),
}

// Timeline lists our settlement's events for the authorization, oldest first (at most
// TimelineLimit); none when we never settled it (the index or the chain may still know it).
func (s *Service) Timeline(ctx context.Context, key facilitator.AuthorizationKey) ([]facilitator.SettlementEvent, error) {
	if _, ok := s.networks[key.Network]; !ok {
		return nil, facilitator.Errorf(facilitator.EInvalid, facilitator.ReasonInvalidNetwork, "network %q is not served here", key.Network)
	}
	row, err := s.store.SettlementByKey(ctx, key)
	if errors.Is(err, facilitator.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, unavailable(err)
	}
	evs, err := s.store.SettlementEvents(ctx, row.ID, 0, timelineStates, TimelineLimit)
	if err != nil {
		return nil, unavailable(err)
	}
	return evs, nil
}

// heads reads the index's head, and the chain's head with its finality tag in one request (so
// both come from one node), and records in st where finality stands by the network's rule.
func (s *Service) heads(ctx context.Context, n Network, st *facilitator.AuthorizationStatus) error {
	cur, ok, err := s.store.Cursor(ctx, n.Network.ID)
	if err != nil {
		return unavailable(err)
	}
	if ok {
		st.IndexedHead = cur.Number
	}
	rule := n.Network.Finality
	var head hexutil.Uint64
	elems := []rpc.BatchElem{ethrpc.BlockNumber(&head)}
	if rule.Tag != "" {
		elems = append(elems, ethrpc.TagElem(rule.Tag))
	}
	var tag facilitator.TagRead
	if err := s.read(ctx, n, elems); err != nil || elems[0].Error != nil {
		// Ledger and index still answer; confirmations, and finality by depth, then count from
		// the index.
		st.Head = st.IndexedHead
	} else {
		st.Head = uint64(head)
		if rule.Tag != "" {
			tag = ethrpc.TagAnswer(elems[1])
		}
	}
	fp := s.floors[n.Network.ID].At(rule, st.Head, tag)
	st.Finality = facilitator.StatusFinality{Rule: fp.Rule}
	if fp.Known {
		st.Finality.FinalBlock = fp.Block
	}
	return nil
}

// read makes one request to n's chain, within its bound.
func (s *Service) read(ctx context.Context, n Network, elems []rpc.BatchElem) error {
	ctx, cancel := context.WithTimeout(ctx, n.Timeout)
	defer cancel()
	return n.Head.BatchCallContext(ctx, elems)
}

// confirm records the block an answer rests on: its confirmations, and whether it is final by
// the rule heads applied.
func (s *Service) confirm(n Network, st *facilitator.AuthorizationStatus, block uint64) {
	st.BlockNumber = block
	if st.Head >= block {
		st.Confirmations = st.Head - block + 1
	}
	st.Final = st.Finality.FinalBlock > 0 && block <= st.Finality.FinalBlock
}

func (s *Service) fromLedger(ctx context.Context, n Network, st facilitator.AuthorizationStatus, row *facilitator.Settlement) (facilitator.AuthorizationStatus, bool, error) {
	st.Basis, st.To, st.Value = "ledger", row.PayTo.Hex(), row.Value.String()
	st.ValidBefore = row.ValidBefore.String()
	if row.TxHash != (common.Hash{}) {
		st.Transaction = row.TxHash.Hex()
	}
	switch row.State {
	case facilitator.StateSigned, facilitator.StateBroadcast:
		st.State = facilitator.StatusPending
	case facilitator.StateMined, facilitator.StateFinal:
		st.State, st.SettledBy = facilitator.StatusSettled, "facilitator"
		s.confirm(n, &st, row.BlockNumber)
		if s.deliveries != nil {
			// Only a transfer of ours carries the merchant's record: a row a reorg took back to
			// reverted or settled elsewhere keeps it in the ledger, but nothing was paid through it.
			rec, err := s.deliveries.DeliveryRecord(ctx, row.ID)
			if err != nil {
				return st, true, unavailable(err)
			}
			st.Delivery = rec
		}
		if row.State == facilitator.StateFinal {
			st.Final = true
		} else if st.Final {
			// Deep enough by the ledger's block number alone; but a mined row's block may have been
			// reorganised away before the engine noticed. Final only while our transfer is still in
			// that very block (stillThere).
			there, err := s.stillThere(ctx, n, st, row)
			if err != nil {
				return st, true, err
			}
			st.Final = there
		}
	case facilitator.StateReverted:
		// Ours reverted, and the authorization stayed usable: someone may have used it since.
		if found, err := s.fromIndex(ctx, n, &st, row.Key); err != nil || found {
			st.Basis = "ledger+index"
			return st, true, err
		}
		if st.IndexedHead < st.Head || st.IndexedHead == 0 {
			// Not in the index, which does not reach the head: "not indexed" is not "unused".
			// The chain says whether it is still unused (failed: sign anew, or settle again) or
			// used since by someone else (a payer told to sign anew would pay twice).
			if err := s.chainUse(ctx, n, &st, row.Key); err != nil {
				return st, true, err
			}
			if st.State != facilitator.StatusUnused {
				st.Basis = "ledger+chain"
				return st, true, nil
			}
			st.Basis = "ledger+chain"
		}
		st.State, st.Reason = facilitator.StatusFailed, row.ErrorReason
	case facilitator.StateExpired:
		st.State, st.Reason = facilitator.StatusExpired, row.ErrorReason
	case facilitator.StateCanceled:
		st.State, st.Reason = facilitator.StatusCanceled, row.ErrorReason
	case facilitator.StateSettledElsewhere:
		// Ours reverted; the transfer that used it is someone else's: the index knows which.
		st.Transaction = ""
		if found, err := s.fromIndex(ctx, n, &st, row.Key); err != nil || found {
			st.Basis = "ledger+index"
			return st, true, err
		}
		st.State, st.SettledBy = facilitator.StatusSettled, "other"
	}
	return st, true, nil
}

// stillThere reports whether a mined row's transfer is still in the block the ledger recorded,
// as far as one can tell without waiting: the index's word when it has the authorization's use
// or covers the block, else the chain's block at that height read by hash. Unsure is false: the
// answer is then settled, not final, until the engine records it final.
func (s *Service) stillThere(ctx context.Context, n Network, st facilitator.AuthorizationStatus, row *facilitator.Settlement) (bool, error) {
	if row.BlockHash == (common.Hash{}) {
		return false, nil
	}
	use, err := s.store.AuthorizationUse(ctx, n.Network.ID, row.Key.Asset, row.Key.Payer, row.Key.Nonce)
	if err != nil {
		return false, unavailable(err)
	}
	switch {
	case use != nil:
		if use.Canceled || use.TxHash != row.TxHash || use.BlockHash != row.BlockHash {
			return false, nil
		}
		// The index agreeing is no proof: an indexer not yet past a reorg still holds the
		// branch it replaced, the very block the ledger recorded.
	case st.IndexedHead >= row.BlockNumber:
		return false, nil // the index holds that block and no use in it: reorganised away, or a gap
	}
	return s.finalThere(ctx, n, row.BlockNumber, row.BlockHash), nil
}

// finalThere reads the block at number, the head and the tag from one node in one request, and
// reports whether that node has hash there, final by its own head: a node still on the branch
// the block was in before a reorg has that hash, but not the depth past it.
func (s *Service) finalThere(ctx context.Context, n Network, number uint64, hash common.Hash) bool {
	read := func(ctx context.Context, elems []rpc.BatchElem) error { return s.read(ctx, n, elems) }
	h, ok := ethrpc.ReadHeight(ctx, read, number, n.Network.Finality)
	// Not read is not known: not final yet.
	return ok && h.Has(hash) && h.Final.Covers(number)
}

func (s *Service) fromIndex(ctx context.Context, n Network, st *facilitator.AuthorizationStatus, key facilitator.AuthorizationKey) (bool, error) {
	use, err := s.store.AuthorizationUse(ctx, key.Network, key.Asset, key.Payer, key.Nonce)
	if err != nil {
		return false, unavailable(err)
	}
	if use == nil {
		return false, nil
	}
	st.Basis = "index"
	st.Transaction = use.TxHash.Hex()
	s.confirm(n, st, use.BlockNumber)
	if st.Final {
		// Deep enough by number; but the index may still hold a branch a reorg replaced, its
		// indexer not yet past it: final only while the chain has that very block.
		st.Final = s.finalThere(ctx, n, use.BlockNumber, use.BlockHash)
	}
	if use.Canceled {
		st.State = facilitator.StatusCanceled
		return true, nil
	}
	st.State, st.SettledBy = facilitator.StatusSettled, s.settledBy(ctx, n, use.TxHash)
	if use.To != (common.Address{}) {
		st.To, st.Value = use.To.Hex(), use.Value.String()
	}
	return true, nil
}

// settledBy names who sent tx, a use of an authorization the ledger does not have as ours:
// "facilitator" when one of the network's signer keys signed it (read from the transaction's
// own signature, ethrpc.SignedTx), "other" when another key did, and "" (the field left out)
// when the transaction could not be read: a node withholding one of ours must not make it
// another's. Asked again, the answer fills it.
func (s *Service) settledBy(ctx context.Context, n Network, tx common.Hash) string {
	if len(n.Signers) == 0 {
		return "other"
	}
	ctx, cancel := context.WithTimeout(ctx, n.Timeout)
	defer cancel()
	_, from, err := ethrpc.SignedTx(ctx, n.Head, tx)
	switch {
	case err != nil:
		return ""
	case slices.Contains(n.Signers, from):
		return "facilitator"
	}
	return "other"
}

// fromChain asks the chain directly: the index may lag, or may not cover the authorization's block.
func (s *Service) fromChain(ctx context.Context, n Network, st facilitator.AuthorizationStatus, key facilitator.AuthorizationKey) (facilitator.AuthorizationStatus, bool, error) {
	st.Basis = "chain"
	if err := s.chainUse(ctx, n, &st, key); err != nil {
		return st, false, err
	}
	return st, false, nil
}

// chainUse answers from the chain alone: authorizationState and the authorization's logs above
// the index, read in one request at the head the answer names (st.Head), so that a node that
// lacks that block answers an error, never its older "unused". Used, with no log of its use
// among the blocks read (the index far behind, or a gap in it), is "used": authorizationState
// is true for a transfer and a cancel alike, and only a log tells them apart.
func (s *Service) chainUse(ctx context.Context, n Network, st *facilitator.AuthorizationStatus, key facilitator.AuthorizationKey) error {
	if st.Head == 0 {
		return facilitator.Unavailable(facilitator.ReasonUnexpectedVerifyError,
			fmt.Sprintf("could not read %s: no head to read the authorization at", n.Network.ID), nil)
	}
	at := hexutil.EncodeUint64(st.Head)
	// Bounded: with no index yet (or one far behind), look at recent blocks only.
	from := st.IndexedHead + 1
	if st.Head > from+recentLogBlocks {
		from = st.Head - recentLogBlocks
	}
	if from > st.Head {
		from = st.Head
	}
	call := map[string]any{"to": key.Asset, "input": hexutil.Bytes(eip3009.AuthorizationStateCalldata(key.Payer, key.Nonce))}
	filter := map[string]any{
		"fromBlock": hexutil.EncodeUint64(from), "toBlock": at, "address": key.Asset,
		"topics": eip3009.AuthorizationTopics(key.Payer, key.Nonce),
	}
	var state hexutil.Bytes
	var logs []types.Log
	elems := []rpc.BatchElem{
		ethrpc.Call(call, at, &state),
		ethrpc.Logs(filter, &logs),
	}
	err := s.read(ctx, n, elems)
	if err == nil {
		err = errors.Join(elems[0].Error, elems[1].Error)
	}
	used, ok := eip3009.DecodeAuthorizationState(state)
	if err == nil && !ok {
		err = fmt.Errorf("authorizationState answered %x", []byte(state))
	}
	if err != nil {
		return facilitator.Unavailable(facilitator.ReasonUnexpectedVerifyError, fmt.Sprintf("could not read %s at block %d", n.Network.ID, st.Head), err)
	}
	if !used {
		st.State = facilitator.StatusUnused
		return nil
	}
	for _, l := range logs {
		if l.Removed || len(l.Topics) == 0 {
			continue
		}
		st.Transaction = l.TxHash.Hex()
		s.confirm(n, st, l.BlockNumber)
		if l.Topics[0] == eip3009.AuthorizationCanceledTopic {
			st.State = facilitator.StatusCanceled
		} else {
			st.State, st.SettledBy = facilitator.StatusSettled, s.settledBy(ctx, n, l.TxHash)
		}
		return nil
	}
	st.State = facilitator.StatusUsed
	return nil
}

// recentLogBlocks bounds the direct log read above the index (providers refuse wide ranges).
const recentLogBlocks = 2000

func unavailable(err error) error {
	return facilitator.Unavailable("status_unavailable", "the ledger is unavailable, retry", err)
}

// ParseNonce parses a 0x-prefixed 32-byte hex nonce.
func ParseNonce(s string) ([32]byte, bool) {
	var n [32]byte
	b, err := hex.DecodeString(trim0x(s))
	if err != nil || len(b) != 32 {
		return n, false
	}
	copy(n[:], b)
	return n, true
}

func trim0x(s string) string {
	if len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X") {
		return s[2:]
	}
	return "!" // not 0x-prefixed: fail decoding
}
