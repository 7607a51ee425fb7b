package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ethereum/go-ethereum/common/hexutil"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// LookupResult is one status-lookup load phase: GET /v1/authorizations/… of settled payments.
type LookupResult struct {
	Concurrency int
	Elapsed     time.Duration
	Requests    int // answered 200 with the payment's transaction
	Failed      int
	FirstFailed string
	Latencies   Latencies
}

// Rate is answered lookups per second.
func (r LookupResult) Rate() float64 { return rate(r.Requests, r.Elapsed) }

// statusPath is the status API's path of a payment's authorization.
func statusPath(t token, p *payment) string {
	return "/v1/authorizations/" + facilitator.CAIP2(t.ChainID) + "/" + t.Address.Hex() + "/" + p.Auth.From.Hex() + "/" + hexutil.Encode(p.Auth.Nonce[:])
}

// runLookups asks for the pays' statuses in turn from c workers until d has passed, as a merchant's
// support desk or an agent resolving an unknown outcome would; a lookup counts when it answers 200
// with a transaction (each of pays was settled before).
func runLookups(ctx context.Context, p *poster, t token, pays []*payment, c int, d time.Duration) LookupResult {
	l := runFor(ctx, c, 0, d, func(i int) string {
		path := statusPath(t, pays[i%len(pays)])
		st, code, err := p.status(ctx, path)
		switch {
		case err != nil:
			return err.Error()
		case code != http.StatusOK || st.Transaction == "":
			return fmt.Sprintf("HTTP %d state %q for %s", code, st.State, path)
		}
		return ""
	})
	return LookupResult{Concurrency: c, Elapsed: l.elapsed, Requests: len(l.lats), Failed: l.bad.n, FirstFailed: l.bad.first, Latencies: l.lats}
}

// status GETs a status path and decodes its answer.
func (p *poster) status(ctx context.Context, path string) (facilitator.AuthorizationStatus, int, error) {
	var st facilitator.AuthorizationStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return st, 0, err
	}
	res, err := p.hc.Do(req)
	if err != nil {
		return st, 0, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return st, res.StatusCode, err
	}
	if res.StatusCode == http.StatusOK {
		err = json.Unmarshal(raw, &st)
	}
	return st, res.StatusCode, err
}
