package main

import (
	"strings"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// A network's finality rule: the configured depth (or its default), and the optional tag that
// decides instead where the chain serves it.
func TestConfigFinality(t *testing.T) {
	token := TokenConfig{Address: "0x0000000000000000000000000000000000000001", Name: "USD Coin", Version: "2"}
	domain := func(nc NetworkConfig) (facilitator.Finality, error) {
		nc.RPC, nc.Tokens = "http://127.0.0.1:8545", []TokenConfig{token}
		ns, err := (&Config{Networks: []NetworkConfig{nc}}).Domain()
		if err != nil {
			return facilitator.Finality{}, err
		}
		return ns[0].Finality, nil
	}
	for _, c := range []struct {
		nc   NetworkConfig
		want facilitator.Finality
	}{
		{NetworkConfig{ID: "eip155:8453"}, facilitator.Finality{Depth: 12}},
		{NetworkConfig{ID: "eip155:31337"}, facilitator.Finality{Depth: 1}},
		{NetworkConfig{ID: "eip155:8453", Finality: 30}, facilitator.Finality{Depth: 30}},
		{NetworkConfig{ID: "eip155:8453", FinalityTag: "finalized"}, facilitator.Finality{Tag: "finalized", Depth: 12}},
		{NetworkConfig{ID: "eip155:1", FinalityTag: "safe", Finality: 64}, facilitator.Finality{Tag: "safe", Depth: 64}},
	} {
		got, err := domain(c.nc)
		if err != nil || got != c.want {
			t.Errorf("%+v: %+v, %v; want %+v", c.nc, got, err, c.want)
		}
	}
	if _, err := domain(NetworkConfig{ID: "eip155:8453", FinalityTag: "latest"}); err == nil || !strings.Contains(err.Error(), `"latest"`) {
		t.Errorf("finalityTag latest: %v, want a clear refusal", err)
	}
}

// A network's quorum: two with several endpoints, one with one, what is configured within them;
// a quorum above the endpoints there are (or below zero) is refused at the configuration check.
func TestConfigQuorum(t *testing.T) {
	token := TokenConfig{Address: "0x0000000000000000000000000000000000000001", Name: "USD Coin", Version: "2"}
	check := func(nc NetworkConfig) error {
		nc.ID, nc.Tokens = "eip155:8453", []TokenConfig{token}
		_, err := (&Config{Networks: []NetworkConfig{nc}}).Domain()
		return err
	}
	one, three := NetworkConfig{RPC: "http://a"}, NetworkConfig{RPCs: []string{"http://a", "http://b", "http://c"}}
	if q := one.quorum(); q != 1 {
		t.Errorf("one endpoint: quorum %d, want 1", q)
	}
	if q := three.quorum(); q != 2 {
		t.Errorf("three endpoints: quorum %d, want 2", q)
	}
	three.Quorum = 3
	if q := three.quorum(); q != 3 || check(three) != nil {
		t.Errorf("quorum 3 of three: %d, %v", q, check(three))
	}
	three.Quorum = 1
	if err := check(three); err != nil {
		t.Errorf("quorum 1 of three (the operator trusts each): %v", err)
	}
	for _, bad := range []NetworkConfig{{RPC: "http://a", Quorum: 2}, {RPCs: []string{"http://a", "http://b"}, Quorum: 3}, {RPC: "http://a", Quorum: -1}} {
		if err := check(bad); err == nil || !strings.Contains(err.Error(), "quorum") {
			t.Errorf("%+v: %v, want a refusal naming the quorum", bad, err)
		}
	}
}
