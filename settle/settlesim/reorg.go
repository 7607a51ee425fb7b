package settlesim

import (
	"errors"
	"fmt"
	"math/big"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
)

// ReorgPolicy says what becomes of the transactions of the blocks a reorganisation removes.
type ReorgPolicy int

const (
	// ReorgToPool puts them back in the pool, as geth reinjects them; the new blocks are empty.
	ReorgToPool ReorgPolicy = iota
	// ReorgDrop forgets them: they are neither in the new blocks nor in the pool (every node
	// lost them), so only a rebroadcast brings them back.
	ReorgDrop
	// ReorgReinclude mines them again, in their order, in the new branch's last block.
	ReorgReinclude
	// ReorgConflictTransfer mines them again after a third party's transaction with the same
	// transferWithAuthorization calldata: theirs transfers, ours reverts.
	ReorgConflictTransfer
	// ReorgConflictCancel mines them again after the authorizer's cancelAuthorization of each
	// authorization: ours reverts, and nothing transfers.
	ReorgConflictCancel
)

func (p ReorgPolicy) String() string {
	switch p {
	case ReorgToPool:
		return "to-pool"
	case ReorgDrop:
		return "drop"
	case ReorgReinclude:
		return "reinclude"
	case ReorgConflictTransfer:
		return "conflict-transfer"
	case ReorgConflictCancel:
		return "conflict-cancel"
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

func (p ReorgPolicy) reincludes() bool { return p >= ReorgReinclude }

// ReorgSpec is a reorganisation.
type ReorgSpec struct {
	// Depth is how many blocks are removed from the head.
	Depth int
	// Length is how many blocks the new branch has; 0 is Depth, or Depth+1 for the policies that
	// re-include (so that what they re-include lands in a later block than before). A Length
	// below Depth makes the chain shorter.
	Length int
	Policy ReorgPolicy
	// Targets are the transfers a conflict policy conflicts with; nil: every
	// transferWithAuthorization in the removed blocks.
	Targets []common.Hash
}

// ErrReorgTooDeep: the reorganisation would remove a finalized block (or the genesis).
var ErrReorgTooDeep = errors.New("settlesim: reorganisation below the finalized block")

// Reorg replaces the last depth blocks with as many new ones (one more for the policies that
// re-include), at new hashes, applying policy to their transactions.
func (c *Chain) Reorg(depth int, policy ReorgPolicy) ([]Block, error) {
	return c.ReorgWith(ReorgSpec{Depth: depth, Policy: policy})
}

// ReorgWith is Reorg with every option.
func (c *Chain) ReorgWith(s ReorgSpec) ([]Block, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, err := c.reorgLocked(s)
	var hashes []common.Hash
	for _, b := range out {
		hashes = append(hashes, b.Hash)
	}
	c.trace.Record("chain reorg depth=%d length=%d %s -> %v %v", s.Depth, s.Length, s.Policy, hashes, err)
	return out, err
}

type txFrom struct {
	tx   *types.Transaction
	from common.Address
}

func (c *Chain) reorgLocked(s ReorgSpec) ([]Block, error) {
	head := c.head()
	if s.Depth < 1 || uint64(s.Depth) > head.number {
		return nil, fmt.Errorf("%w: depth %d at head %d", ErrReorgTooDeep, s.Depth, head.number)
	}
	fork := c.canon[head.number-uint64(s.Depth)]
	if head.number >= c.cfg.FinalizedDepth && fork.number < head.number-c.cfg.FinalizedDepth {
		return nil, fmt.Errorf("%w: depth %d, finalized depth %d", ErrReorgTooDeep, s.Depth, c.cfg.FinalizedDepth)
	}
	removed := c.canon[fork.number+1:]
	var old []txFrom
	for _, b := range removed {
		for i, tx := range b.txs {
			old = append(old, txFrom{tx, b.senders[i]})
		}
	}
	length := s.Length
	if length == 0 {
		length = s.Depth
		if s.Policy.reincludes() {
			length++
		}
	}
	var targets map[common.Hash]bool
	if s.Targets != nil {
		targets = map[common.Hash]bool{}
		for _, h := range s.Targets {
			targets[h] = true
		}
	}
	c.forks++
	extra := []byte(fmt.Sprintf("settlesim fork %d", c.forks))

	var (
		branch   []*block
		leftOver []txFrom // re-included transactions the new branch could not take
		parent   = fork
	)
	for i := 0; i < length; i++ {
		want := uint64(c.clock.Now().Unix())
		if i < len(removed) {
			// The new branch's blocks take the removed ones' slots.
			want = removed[i].header.Time
		}
		time := blockTime(parent, want)
		baseFee := c.nextBaseFee(parent)
		st := parent.state.copy()
		if i == 0 {
			for j := range c.cheats {
				if c.cheats[j].at > fork.number {
					c.cheats[j].apply(st)
					c.cheats[j].at = fork.number + 1
				}
			}
		}
		env := c.envAt(parent.number+1, time)
		var list []txFrom
		if i == length-1 && s.Policy.reincludes() {
			if s.Policy != ReorgReinclude {
				list = append(list, c.conflicts(old, targets, s.Policy, st, baseFee)...)
			}
			list = append(list, old...)
		}
		var (
			txs      []*types.Transaction
			senders  []common.Address
			receipts []*types.Receipt
			gasUsed  uint64
		)
		for _, t := range list {
			if gasUsed+t.tx.Gas() > c.cfg.GasLimit {
				leftOver = append(leftOver, t)
				continue
			}
			rcpt, err := c.apply(st, env, baseFee, t.tx, t.from)
			if err != nil {
				leftOver = append(leftOver, t)
				continue
			}
			gasUsed += rcpt.GasUsed
			txs, senders, receipts = append(txs, t.tx), append(senders, t.from), append(receipts, rcpt)
		}
		b := c.seal(parent, st, txs, senders, receipts, time, baseFee, gasUsed, extra)
		branch = append(branch, b)
		parent = b
	}
	c.setHead(parent)

	inBranch := map[common.Hash]bool{}
	for _, b := range branch {
		for _, tx := range b.txs {
			inBranch[tx.Hash()] = true
		}
	}
	switch s.Policy {
	case ReorgDrop:
		for _, t := range old {
			c.txs[t.tx.Hash()].fate = "dropped by a reorganisation"
		}
	case ReorgToPool:
		leftOver = old
	}
	for _, t := range leftOver {
		if inBranch[t.tx.Hash()] {
			continue
		}
		if c.admit(t.tx, t.from, c.head(), c.txs[t.tx.Hash()].source, false) != nil {
			c.txs[t.tx.Hash()].fate = "dropped by a reorganisation"
		}
	}
	out := make([]Block, len(branch))
	for i, b := range branch {
		out[i] = b.info()
	}
	return out, nil
}

// conflicts builds the third party's transactions that go before the re-included ones: for each
// targeted transferWithAuthorization, the same calldata (a transfer) or the authorizer's cancel.
func (c *Chain) conflicts(old []txFrom, targets map[common.Hash]bool, p ReorgPolicy, st *state, baseFee *big.Int) []txFrom {
	var out []txFrom
	nonce := st.nonces[c.third]
	seen := map[authKey]bool{}
	for _, t := range old {
		if targets != nil && !targets[t.tx.Hash()] {
			continue
		}
		call, ok := DecodeTokenCall(t.tx.Data())
		if !ok || call.Kind != UseTransfer || t.tx.To() == nil || *t.tx.To() != c.cfg.Token {
			continue
		}
		key := authKey{call.Authorization.From, call.Authorization.Nonce}
		if seen[key] {
			continue
		}
		seen[key] = true
		data, exec := t.tx.Data(), uint64(transferExecGas)
		if p == ReorgConflictCancel {
			data, exec = cancelCalldata(call.Authorization.From, call.Authorization.Nonce), cancelExecGas
		}
		n := nonce
		nonce++
		tip := new(big.Int).Mul(c.tip, big.NewInt(2))
		gas := intrinsicGas(data) + exec
		to := c.cfg.Token
		tx, from := c.buildLocked(ForeignTx{Key: c.cfg.ThirdParty, Nonce: &n, To: &to, Data: data, TipCap: tip,
			FeeCap: new(big.Int).Add(new(big.Int).Mul(baseFee, big.NewInt(2)), tip), Gas: gas + gas/4})
		c.record(tx, from, SourceThirdParty)
		out = append(out, txFrom{tx, from})
	}
	return out
}
