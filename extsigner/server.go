package extsigner

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/rpc"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"
)

// Server is the narrow signer: it holds keys and answers Clef's account_list and
// account_signTransaction for them, signing only what its Policy allows. Its handler serves
// JSON-RPC over HTTP; put it on loopback or a private network, next to nothing else.
type Server struct {
	policy Policy
	keys   map[common.Address]*ecdsa.PrivateKey
	addrs  []common.Address
	log    *slog.Logger
	now    func() time.Time

	mu     sync.Mutex // guards window
	window budget
}

// Option configures a Server.
type Option func(*Server)

// WithClock makes now the server's clock (the window's); the default is time.Now.
func WithClock(now func() time.Time) Option { return func(s *Server) { s.now = now } }

// NewServer is the narrow signer of keys under policy.
func NewServer(policy Policy, keys []*ecdsa.PrivateKey, log *slog.Logger, opts ...Option) (*Server, error) {
	switch {
	case policy.ChainID == 0:
		return nil, errors.New("signer: a chain id is required")
	case policy.Token == (common.Address{}):
		return nil, errors.New("signer: a token address is required")
	case policy.TokenName == "" || policy.TokenVersion == "":
		return nil, errors.New("signer: the token's EIP-712 name and version are required (the authorizations' signatures are checked in its domain)")
	case policy.MaxGas == 0:
		return nil, errors.New("signer: a gas ceiling is required")
	case policy.MaxFeeCap == nil || policy.MaxFeeCap.Sign() <= 0:
		return nil, errors.New("signer: a fee ceiling is required")
	case len(keys) == 0:
		return nil, errors.New("signer: no keys")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	policy.Window = policy.Window.orDefault()
	s := &Server{policy: policy, keys: map[common.Address]*ecdsa.PrivateKey{}, log: log, now: time.Now, window: budget{w: policy.Window}}
	for _, o := range opts {
		o(s)
	}
	for _, k := range keys {
		a := crypto.PubkeyToAddress(k.PublicKey)
		if _, dup := s.keys[a]; !dup {
			s.addrs = append(s.addrs, a)
		}
		s.keys[a] = k
	}
	return s, nil
}

// Accounts are the addresses of the server's keys.
func (s *Server) Accounts() []common.Address { return slices.Clone(s.addrs) }

// Handler is the JSON-RPC endpoint (POST /).
func (s *Server) Handler() (http.Handler, error) {
	srv := rpc.NewServer()
	if err := srv.RegisterName("account", &accountAPI{s}); err != nil {
		return nil, err
	}
	return srv, nil
}

// RequirePassword lets only requests carrying password (HTTP basic auth, any user name: what a
// client URL http://user:password@host/ sends) reach h: the narrow signer's own authentication,
// so that reaching its port is not enough to have it sign. The comparison takes constant time.
func RequirePassword(h http.Handler, password string) http.Handler {
	want := sha256.Sum256([]byte(password))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, got, ok := r.BasicAuth()
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="facilitator signer"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Policy is the server's policy, its window's defaults filled in.
func (s *Server) Policy() Policy { return s.policy }

// Sign signs args when the policy allows them, the window has room for them and args.From is
// one of the keys; the error says why not. It is account_signTransaction.
func (s *Server) Sign(args *apitypes.SendTxArgs) (*types.Transaction, error) {
	from := args.From.Address()
	key, ok := s.keys[from]
	if !ok {
		return nil, fmt.Errorf("%w: from %s is not an account of this signer", ErrRefused, from)
	}
	if isProbe(args) {
		// Checked as a settlement's key and chain are, and then signed never: the narrow signer
		// signs nothing but settlements.
		if args.ChainID == nil || args.ChainID.ToInt().Cmp(new(big.Int).SetUint64(s.policy.ChainID)) != 0 {
			return nil, fmt.Errorf("%w: chainId %s is not this signer's chain %d", ErrRefused, args.ChainID.ToInt(), s.policy.ChainID)
		}
		return nil, probeAnswer{s.policy.ChainID}
	}
	tx, err := s.policy.Check(args)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	err = s.window.admit(s.now(), from, uint64(args.Nonce), uint64(args.Gas))
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return types.SignNewTx(key, types.LatestSignerForChainID(new(big.Int).SetUint64(s.policy.ChainID)), tx)
}

// accountAPI is the "account" namespace of Clef's external API, as far as settling needs it.
type accountAPI struct{ s *Server }

// List is account_list.
func (a *accountAPI) List() []common.Address { return slices.Clone(a.s.addrs) }

// Version is account_version: the external API version this signer speaks (Clef's).
func (a *accountAPI) Version() string { return "6.1.0" }

// SignTransactionResult is account_signTransaction's answer, as Clef gives it.
type SignTransactionResult struct {
	Raw hexutil.Bytes      `json:"raw"`
	Tx  *types.Transaction `json:"tx"`
}

// SignTransaction is account_signTransaction. methodSelector (Clef's hint for its UI) is
// ignored: the calldata itself is checked.
func (a *accountAPI) SignTransaction(_ context.Context, args apitypes.SendTxArgs, _ *string) (*SignTransactionResult, error) {
	tx, err := a.s.Sign(&args)
	var probe probeAnswer
	if errors.As(err, &probe) {
		a.s.log.Debug("probe answered", "from", args.From.Address())
		return nil, probe // as it is: its JSON-RPC code is what the prober reads
	}
	if err != nil {
		a.s.log.Warn("signing refused", "from", args.From.Address(), "err", err)
		return nil, err
	}
	raw, err := tx.MarshalBinary()
	if err != nil {
		return nil, err
	}
	a.s.log.Info("signed", "from", args.From.Address(), "tx", tx.Hash(), "tx_nonce", tx.Nonce())
	return &SignTransactionResult{Raw: raw, Tx: tx}, nil
}
