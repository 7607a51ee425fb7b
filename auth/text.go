package auth

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum/common"
	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// ParseGasBudget reads a key's gas budget as an operator writes it: wei, or "default" (nil: the
// server's default; see facilitator.APIKey.GasBudgetWei).
func ParseGasBudget(s string) (*big.Int, error) {
	if s = strings.TrimSpace(s); s == "default" {
		return nil, nil
	}
	v, ok := new(big.Int).SetString(s, 10)
	if !ok || v.Sign() < 0 {
		return nil, fmt.Errorf("%q is neither a non-negative number of wei nor default", s)
	}
	return v, nil
}

// GasBudgetText shows a key's gas budget: "default" (nil), "unlimited" (0) or wei.
func GasBudgetText(wei *big.Int) string {
	switch {
	case wei == nil:
		return "default"
	case wei.Sign() == 0:
		return "unlimited"
	}
	return wei.String()
}

// ScopesText is a scope list as ParseScopes reads it, comma-separated.
func ScopesText(scopes []facilitator.Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, ",")
}

// PayToText is a payTo allow-list as ParsePayTo reads it, comma-separated ("" for none: any payTo).
func PayToText(payTo []common.Address) string {
	s := make([]string, len(payTo))
	for i, a := range payTo {
		s[i] = a.Hex()
	}
	return strings.Join(s, ",")
}
