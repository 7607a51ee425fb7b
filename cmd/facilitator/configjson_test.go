package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigJSONErrors: a networks JSON that does not decode is refused naming its file (or the
// flag and variable it came in) and the line and column of what is wrong.
func TestConfigJSONErrors(t *testing.T) {
	for _, c := range []struct {
		name, json, want string
	}{
		{"syntax: a trailing comma", "[\n  {\"id\": \"eip155:1\",\n   \"rpc\": \"http://x\",}\n]", `:3:22: invalid character '}' looking for beginning of object key string`},
		{"syntax: a missing comma", "[{\"id\": \"eip155:1\"\n  \"rpc\": \"http://x\"}]", `:2:3: invalid character '"' after object key:value pair`},
		{"unknown field", "[\n {\"id\": \"eip155:1\",\n  \"rpcUrl\": \"http://x\"}\n]", `:3:3: unknown field "rpcUrl"`},
		{"unknown field in a token", "[{\"id\": \"eip155:1\", \"rpc\": \"http://x\",\n  \"tokens\": [{\"address\": \"0x1\", \"name\": \"USDC\",\n    \"decimal\": 6}]}]", `:3:5: unknown field "decimal"`},
		{"unknown field in fees, after a valid second entry's", "[{\"preset\": \"base\", \"rpc\": \"http://x\"},\n {\"preset\": \"base-sepolia\", \"rpc\": \"http://y\",\n  \"fees\": {\"bumpPercent\": 20, \"bumpPercentage\": 20}}]", `:3:31: unknown field "bumpPercentage"`},
		{"unknown field named like a known one elsewhere", "[{\"id\": \"eip155:1\", \"rpc\": \"http://x\", \"tokens\": [{\"name\": \"USDC\"}],\n  \"name\": \"mainnet\"}]", `:2:3: unknown field "name"`},
		{"wrong type", "[{\"id\": \"eip155:1\",\n  \"finality\": \"12\"}]", `:2:15: cannot unmarshal string into Go struct field NetworkConfig.finality of type uint64`},
		{"wrong type, a number", "[{\"id\": \"eip155:1\",\n  \"quorum\": 2.5}]", `:2:13: cannot unmarshal number 2.5 into Go struct field NetworkConfig.quorum of type int`},
		{"wrong type, an escaped string", "[{\"id\": \"eip155:1\",\n  \"logRange\": \"a\\\"b\"}]", `:2:15: cannot unmarshal string into Go struct field NetworkConfig.logRange of type uint64`},
		{"an object, not an array", "{\"id\": \"eip155:1\"}", `:1:1: cannot unmarshal object into Go value of type []main.NetworkConfig`},
		{"truncated", "[{\"id\": \"eip155:1\",\n", `:2:1: unexpected EOF`},
		{"more after the array", "[{\"id\": \"eip155:1\", \"rpc\": \"http://x\"}]\n[]", `:2:1: more after the networks array`},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "networks.json")
			if err := os.WriteFile(file, []byte(c.json), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, src := range []struct{ source, env string }{
				{file, "FACILITATOR_NETWORKS_FILE"},
				{"networks JSON (--networks or FACILITATOR_NETWORKS)", "FACILITATOR_NETWORKS"},
			} {
				value := file
				if src.env == "FACILITATOR_NETWORKS" {
					value = c.json
				}
				_, err := parseServeFlags(nil, func(k string) string {
					if k == src.env {
						return value
					}
					return ""
				})
				if err == nil || !strings.HasPrefix(err.Error(), src.source+c.want) {
					t.Errorf("%s: error %v,\nwant %s%s", src.env, err, src.source, c.want)
				}
			}
		})
	}
}
