package devchain

import (
	"context"
	"crypto/ecdsa"
	"fmt"
	"math/big"
	"path/filepath"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/math"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"
)

// USDC is Circle's FiatTokenV2_2 behind its FiatTokenProxy, initialised the way
// the production token is (initialize, initializeV2, V2_1, V2_2).
type USDC struct {
	Address  common.Address // the proxy, i.e. the token address
	Name     string         // read from the contract: "USD Coin"
	Version  string         // read from the contract: "2"
	Decimals uint8
	ABI      abi.ABI // FiatTokenV2_2's ABI, for callers that need to pack or decode directly

	Implementation common.Address
	chain          *Chain
}

func (c *Chain) deployUSDC(ctx context.Context) (*USDC, error) {
	dir := filepath.Join(c.nodeModules, stablecoinArtifacts)
	checkerArt, err := loadArtifact(filepath.Join(dir, signatureCheckerRel))
	if err != nil {
		return nil, err
	}
	tokenArt, err := loadArtifact(filepath.Join(dir, fiatTokenRel))
	if err != nil {
		return nil, err
	}
	proxyArt, err := loadArtifact(filepath.Join(dir, fiatTokenProxyRel))
	if err != nil {
		return nil, err
	}
	r := c.roles

	checkerCode, err := checkerArt.link(nil)
	if err != nil {
		return nil, err
	}
	checker, err := c.deploy(ctx, r.deployer, checkerCode)
	if err != nil {
		return nil, fmt.Errorf("deploy SignatureChecker: %w", err)
	}
	tokenCode, err := tokenArt.link(map[string]common.Address{"SignatureChecker": checker})
	if err != nil {
		return nil, err
	}
	impl, err := c.deploy(ctx, r.deployer, tokenCode)
	if err != nil {
		return nil, fmt.Errorf("deploy FiatTokenV2_2: %w", err)
	}
	proxyCode, err := proxyArt.link(nil)
	if err != nil {
		return nil, err
	}
	ctorArgs, err := proxyArt.ABI.Pack("", impl)
	if err != nil {
		return nil, err
	}
	// The deployer of the proxy becomes its admin, and the admin may not call the
	// token through the proxy, so it gets an account of its own.
	proxy, err := c.deploy(ctx, r.proxyAdmin, append(proxyCode, ctorArgs...))
	if err != nil {
		return nil, fmt.Errorf("deploy FiatTokenProxy: %w", err)
	}
	// Clients of a running stack find the token through DevUSDCAddress; keep that promise checked.
	if want, err := DevUSDCAddress(); err != nil || proxy != want {
		return nil, fmt.Errorf("devchain: USDC proxy deployed at %s, DevUSDCAddress says %s (%v)", proxy, want, err)
	}

	u := &USDC{Address: proxy, ABI: tokenArt.ABI, Implementation: impl, chain: c}
	steps := []struct {
		from   *Account
		method string
		args   []any
	}{
		{r.deployer, "initialize", []any{"USD Coin", "USDC", "USD", uint8(6), r.masterMinter.Address, r.pauser.Address, r.blacklister.Address, r.owner.Address}},
		{r.deployer, "initializeV2", []any{"USD Coin"}},
		{r.deployer, "initializeV2_1", []any{r.lostAndFound.Address}},
		{r.deployer, "initializeV2_2", []any{[]common.Address{}, "USDC"}},
		{r.masterMinter, "configureMinter", []any{r.minter.Address, math.MaxBig256}},
	}
	for _, s := range steps {
		if _, err := c.transact(ctx, s.from, proxy, &u.ABI, s.method, s.args...); err != nil {
			return nil, fmt.Errorf("USDC setup: %w", err)
		}
	}
	if err := u.readMetadata(ctx); err != nil {
		return nil, err
	}
	return u, nil
}

// readMetadata loads name/version/decimals from the chain and checks that the
// contract's DOMAIN_SEPARATOR is the one an off-chain signer would compute.
func (u *USDC) readMetadata(ctx context.Context) error {
	name, err := u.chain.call(ctx, u.Address, &u.ABI, "name")
	if err != nil {
		return err
	}
	version, err := u.chain.call(ctx, u.Address, &u.ABI, "version")
	if err != nil {
		return err
	}
	decimals, err := u.chain.call(ctx, u.Address, &u.ABI, "decimals")
	if err != nil {
		return err
	}
	u.Name, u.Version, u.Decimals = name[0].(string), version[0].(string), decimals[0].(uint8)

	out, err := u.chain.call(ctx, u.Address, &u.ABI, "DOMAIN_SEPARATOR")
	if err != nil {
		return err
	}
	got := common.Hash(out[0].([32]byte))
	td := u.typedData(TransferAuthorization{})
	want, err := td.HashStruct("EIP712Domain", td.Domain.Map())
	if err != nil {
		return fmt.Errorf("devchain: hash EIP-712 domain: %w", err)
	}
	if got != common.BytesToHash(want) {
		return fmt.Errorf("devchain: USDC DOMAIN_SEPARATOR %s != EIP-712 domain hash %s of (%q, %q, %d, %s)",
			got, common.BytesToHash(want), u.Name, u.Version, u.chain.ChainID, u.Address)
	}
	return nil
}

// Domain is the token's EIP-712 domain as x402 clients build it.
func (u *USDC) Domain() apitypes.TypedDataDomain {
	return apitypes.TypedDataDomain{
		Name:              u.Name,
		Version:           u.Version,
		ChainId:           math.NewHexOrDecimal256(int64(u.chain.ChainID)),
		VerifyingContract: u.Address.Hex(),
	}
}

// Mint mints amount to `to` from the minter role.
func (u *USDC) Mint(ctx context.Context, to common.Address, amount *big.Int) error {
	_, err := u.chain.transact(ctx, u.chain.roles.minter, u.Address, &u.ABI, "mint", to, amount)
	return err
}

// Blacklist blacklists addr from the blacklister role.
func (u *USDC) Blacklist(ctx context.Context, addr common.Address) error {
	_, err := u.chain.transact(ctx, u.chain.roles.blacklister, u.Address, &u.ABI, "blacklist", addr)
	return err
}

// Unblacklist lifts a Blacklist.
func (u *USDC) Unblacklist(ctx context.Context, addr common.Address) error {
	_, err := u.chain.transact(ctx, u.chain.roles.blacklister, u.Address, &u.ABI, "unBlacklist", addr)
	return err
}

// BalanceOf returns addr's balance in atomic units.
func (u *USDC) BalanceOf(ctx context.Context, addr common.Address) (*big.Int, error) {
	out, err := u.chain.call(ctx, u.Address, &u.ABI, "balanceOf", addr)
	if err != nil {
		return nil, err
	}
	return out[0].(*big.Int), nil
}

// AuthorizationState reports whether an EIP-3009 nonce has been used (or cancelled).
func (u *USDC) AuthorizationState(ctx context.Context, authorizer common.Address, nonce [32]byte) (bool, error) {
	out, err := u.chain.call(ctx, u.Address, &u.ABI, "authorizationState", authorizer, nonce)
	if err != nil {
		return false, err
	}
	return out[0].(bool), nil
}

// TransferWithAuthorization submits an EIP-3009 transfer paid for by sender.
// A 65-byte signature goes through the (v, r, s) overload, like x402 settles EOA
// payments; anything else through the `bytes signature` overload, which is how
// ERC-1271 wallets are settled. It waits for the receipt and fails on revert.
func (u *USDC) TransferWithAuthorization(ctx context.Context, sender *Account, from, to common.Address,
	value, validAfter, validBefore *big.Int, nonce [32]byte, sig []byte) (common.Hash, error) {
	var (
		method string
		args   = []any{from, to, value, validAfter, validBefore, nonce}
	)
	if len(sig) == 65 {
		v := sig[64]
		if v < 27 {
			v += 27
		}
		var r, s [32]byte
		copy(r[:], sig[:32])
		copy(s[:], sig[32:64])
		method = u.overload("transferWithAuthorization", 9)
		args = append(args, v, r, s)
	} else {
		method = u.overload("transferWithAuthorization", 7)
		args = append(args, sig)
	}
	if method == "" {
		return common.Hash{}, fmt.Errorf("devchain: transferWithAuthorization overload missing from ABI")
	}
	rcpt, err := u.chain.transact(ctx, sender, u.Address, &u.ABI, method, args...)
	if err != nil {
		if rcpt != nil {
			return rcpt.TxHash, err
		}
		return common.Hash{}, err
	}
	return rcpt.TxHash, nil
}

// CancelAuthorization has payer sign EIP-3009's CancelAuthorization(authorizer, nonce) and sender
// submit it (the bytes-signature overload); it returns the mined transaction's hash.
func (u *USDC) CancelAuthorization(ctx context.Context, sender *Account, payer *ecdsa.PrivateKey, nonce [32]byte) (common.Hash, error) {
	data, err := u.CancelAuthorizationCalldata(payer, nonce)
	if err != nil {
		return common.Hash{}, err
	}
	rcpt, err := u.chain.send(ctx, sender, &u.Address, data)
	if err != nil {
		return common.Hash{}, fmt.Errorf("cancelAuthorization: %w", err)
	}
	return rcpt.TxHash, nil
}

// CancelAuthorizationCalldata is the calldata of cancelAuthorization(authorizer, nonce, signature)
// (the bytes-signature overload) with payer's signature: for a test that signs and places the
// transaction itself (a reorganisation's new branch).
func (u *USDC) CancelAuthorizationCalldata(payer *ecdsa.PrivateKey, nonce [32]byte) ([]byte, error) {
	sig, err := u.SignCancelAuthorization(payer, nonce)
	if err != nil {
		return nil, err
	}
	method := u.overload("cancelAuthorization", 3)
	if method == "" {
		return nil, fmt.Errorf("devchain: cancelAuthorization(address,bytes32,bytes) missing from ABI")
	}
	data, err := u.ABI.Pack(method, crypto.PubkeyToAddress(payer.PublicKey), nonce, sig)
	if err != nil {
		return nil, fmt.Errorf("devchain: pack cancelAuthorization: %w", err)
	}
	return data, nil
}

// overload finds go-ethereum's name for an overloaded method (it appends 0, 1, ...
// in ABI order) by its argument count.
func (u *USDC) overload(raw string, nargs int) string {
	for name, m := range u.ABI.Methods {
		if m.RawName == raw && len(m.Inputs) == nargs {
			return name
		}
	}
	return ""
}
