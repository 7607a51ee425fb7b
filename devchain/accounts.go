package devchain

import (
	"crypto/ecdsa"
	"fmt"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

// Account is a key the chain knows how to sign for.
type Account struct {
	Key     *ecdsa.PrivateKey
	Address common.Address
}

// devKeys are the keys anvil derives from its default mnemonic
// "test test test test test test test test test test test junk" (m/44'/60'/0'/0/i).
// They are listed rather than derived so the package needs no BIP-39/BIP-32 code;
// Start cross-checks them against anvil's eth_accounts.
func devKeys() []string {
	return []string{
		"ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80",
		"59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d",
		"5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a",
		"7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6",
		"47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a",
		"8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba",
		"92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e",
		"4bbbf85ce3377467afe5d46f804f221813b2bb87f24d81f60f1fcdbf7cbf4356",
		"dbda1821b80551c9d65939329250298aa3472ba22feea921c0cf5d620ea67b97",
		"2a871d0798f97d79848a013d4936a73bf4cc922c825d33c1cf7073dff6d409c6",
	}
}

func accountFromHex(hexKey string) (*Account, error) {
	key, err := crypto.HexToECDSA(hexKey)
	if err != nil {
		return nil, err
	}
	return &Account{Key: key, Address: crypto.PubkeyToAddress(key.PublicKey)}, nil
}

// DevAccounts are anvil's ten default accounts, #0 first: what a client of a running dev stack
// (the load generator) signs with, since it cannot ask the stack for them.
func DevAccounts() ([]*Account, error) { return devAccounts() }

// ExtraSigner is the dev stack's i-th extra facilitator signer key (i from 1), derived like the
// role keys so that every run, and a load generator reading the chain, sees the same addresses.
func ExtraSigner(i int) (*Account, error) { return roleAccount(fmt.Sprintf("signer %d", i)) }

// BenchEmitter is the key that sends the backfill benchmark's event-emitting transactions: off the
// ten dev accounts and the signer keys, which the load's other phases send from, so that it never
// shares a nonce sequence with them. Whoever uses it funds it (anvil_setBalance).
func BenchEmitter() (*Account, error) { return roleAccount("bench emitter") }

// DevUSDCAddress is where Start deploys the USDC proxy: the proxy-admin role's first (and only)
// deployment, so a client of a running dev stack can find the token without being told.
func DevUSDCAddress() (common.Address, error) {
	r, err := roleAccount("proxy-admin")
	if err != nil {
		return common.Address{}, err
	}
	return crypto.CreateAddress(r.Address, 0), nil
}

func devAccounts() ([]*Account, error) {
	var accs []*Account
	for i, k := range devKeys() {
		a, err := accountFromHex(k)
		if err != nil {
			return nil, fmt.Errorf("dev key %d: %w", i, err)
		}
		accs = append(accs, a)
	}
	return accs, nil
}

// roleAccount derives a deterministic key for an admin role. Keeping roles off the
// ten dev accounts means tests see those accounts with nonce 0 and no special powers,
// and the addresses are the same on every run, which makes logs comparable.
func roleAccount(role string) (*Account, error) {
	key, err := crypto.ToECDSA(crypto.Keccak256([]byte("x402-facilitator devchain role: " + role)))
	if err != nil {
		return nil, fmt.Errorf("role %s: %w", role, err)
	}
	return &Account{Key: key, Address: crypto.PubkeyToAddress(key.PublicKey)}, nil
}

// roles are the accounts that administer the token and pay for deployments.
type roles struct {
	deployer, proxyAdmin, masterMinter, minter, pauser, blacklister, owner, lostAndFound *Account
}

func newRoles() (*roles, error) {
	r := &roles{}
	for _, x := range []struct {
		name string
		dst  **Account
	}{
		{"deployer", &r.deployer},
		{"proxy-admin", &r.proxyAdmin},
		{"master-minter", &r.masterMinter},
		{"minter", &r.minter},
		{"pauser", &r.pauser},
		{"blacklister", &r.blacklister},
		{"owner", &r.owner},
		{"lost-and-found", &r.lostAndFound},
	} {
		a, err := roleAccount(x.name)
		if err != nil {
			return nil, err
		}
		*x.dst = a
	}
	return r, nil
}

func (r *roles) all() []*Account {
	return []*Account{r.deployer, r.proxyAdmin, r.masterMinter, r.minter, r.pauser, r.blacklister, r.owner, r.lostAndFound}
}
