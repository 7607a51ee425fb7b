package api_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkVerify measures POST /verify of one valid v2 payment end to end: HTTP, JSON decoding,
// the verifier and its reads on anvil (through a counting proxy, which adds one local hop per
// round trip). It reports the JSON-RPC calls and HTTP round trips per verify, once the token's
// code is cached.
//
//	go test ./api/ -run '^$' -bench BenchmarkVerify -benchtime 2000x
func BenchmarkVerify(b *testing.B) {
	s := newStack(b, stackOptions{})
	body := newPayment(b, 1).body(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.Cleanup(client.CloseIdleConnections)

	post := func() []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/verify", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		out, err := io.ReadAll(res.Body)
		if err != nil {
			b.Fatal(err)
		}
		if res.StatusCode != http.StatusOK || !bytes.HasPrefix(out, []byte(`{"isValid":true`)) {
			b.Fatalf("HTTP %d %s", res.StatusCode, out)
		}
		return out
	}

	// The first verify also reads the token's code, which is then cached.
	post()
	s.RPC.reset()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		post()
	}
	b.StopTimer()
	b.ReportMetric(float64(s.RPC.calls.Load())/float64(b.N), "rpc-calls/op")
	b.ReportMetric(float64(s.RPC.roundTrips.Load())/float64(b.N), "rpc-roundtrips/op")
}
