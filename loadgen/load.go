package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// poster sends request bodies to one facilitator.
type poster struct {
	base string
	hc   *http.Client
}

// post sends body to path and decodes a JSON answer into out, whatever the status.
func (p *poster) post(ctx context.Context, path string, body []byte, out any) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := p.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return res.StatusCode, res.Header, err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return res.StatusCode, res.Header, fmt.Errorf("HTTP %d, not JSON: %.200s", res.StatusCode, raw)
	}
	return res.StatusCode, res.Header, nil
}

// problems counts failed requests and keeps the first one's description.
type problems struct {
	mu    sync.Mutex
	n     int
	first string
}

func (p *problems) add(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		p.first = fmt.Sprintf(format, args...)
	}
	p.n++
}

// VerifyResult is one /verify load phase.
type VerifyResult struct {
	// Offered is the arrival rate the phase sent at, per second; 0 is a closed loop, each of
	// Concurrency callers sending again as soon as it is answered.
	Offered     float64
	Concurrency int
	// Payments is how many distinct payments were signed for the phase: each is sent at most once,
	// so no verdict comes from a cache a merchant's traffic would not hit. Sent is how many were.
	Payments, Sent int
	Elapsed        time.Duration // first request to the last answer
	Requests       int           // answered with isValid:true
	Failed         int           // transport errors, non-200s and isValid:false
	FirstFailed    string
	Latencies      Latencies
}

// Rate is valid verdicts per second.
func (r VerifyResult) Rate() float64 { return rate(r.Requests, r.Elapsed) }

// runVerify sends each of pays to /verify once, at offered requests per second (0: as fast as c
// callers are answered), until every payment has been sent or d has passed (a request started
// before then is waited for and counted). Every payment is distinct, as every payment of a
// merchant's traffic is: a verdict is never asked for twice.
func runVerify(ctx context.Context, p *poster, pays []*payment, offered float64, c int, d time.Duration) VerifyResult {
	one := func(i int) string {
		var res facilitator.VerifyResponse
		status, _, err := p.post(ctx, "/verify", pays[i].Body, &res)
		switch {
		case err != nil:
			return err.Error()
		case status != http.StatusOK || !res.IsValid:
			return fmt.Sprintf("HTTP %d isValid=%v %s %s", status, res.IsValid, res.InvalidReason, res.InvalidMessage)
		}
		return ""
	}
	var l timedLoad
	if offered > 0 {
		l = runAt(ctx, offered, c, len(pays), d, one)
	} else {
		l = runFor(ctx, c, len(pays), d, one)
	}
	return VerifyResult{Offered: offered, Concurrency: c, Payments: len(pays), Sent: len(l.lats) + l.bad.n,
		Elapsed: l.elapsed, Requests: len(l.lats), Failed: l.bad.n, FirstFailed: l.bad.first, Latencies: l.lats}
}

// timedLoad is what a load of one kind of request measured: the latencies of those that
// succeeded, and the failures.
type timedLoad struct {
	elapsed time.Duration // first request to the last answer
	lats    Latencies
	bad     *problems
}

// runFor calls one with consecutive request numbers from 0 from c workers until d has passed or,
// when n > 0, n requests have been made (a request started before then is waited for and
// counted); one answers "" for a success, else what failed.
func runFor(ctx context.Context, c, n int, d time.Duration, one func(i int) string) timedLoad {
	var next atomic.Int64
	bad := &problems{}
	lats := make([]Latencies, c)
	begin := time.Now()
	deadline := begin.Add(d)
	var wg sync.WaitGroup
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if n > 0 && i >= n {
					return
				}
				if took, ok := timeOne(one, i, bad); ok {
					lats[w] = append(lats[w], took)
				}
			}
		}()
	}
	wg.Wait()
	r := timedLoad{elapsed: time.Since(begin), bad: bad}
	for _, l := range lats {
		r.lats = append(r.lats, l...)
	}
	return r
}

// timeOne makes request i and returns its latency, or false once what failed is noted in bad.
func timeOne(one func(i int) string, i int, bad *problems) (time.Duration, bool) {
	t0 := time.Now()
	problem := one(i)
	took := time.Since(t0)
	if problem != "" {
		bad.add("%s", problem)
		return 0, false
	}
	return took, true
}

// runAt starts request i (from 0) at i/offered seconds after the start, whether or not the earlier
// ones have been answered, as independent clients arrive, until n requests have started or d has
// passed (those started are waited for and counted). At most c are outstanding: an arrival that
// finds c waits for one of them, so a rate the server cannot answer shows as a lower achieved
// rate, not as an unbounded queue in this process. A latency is from the request's start.
func runAt(ctx context.Context, offered float64, c, n int, d time.Duration, one func(i int) string) timedLoad {
	bad := &problems{}
	var mu sync.Mutex
	var lats Latencies
	slots := make(chan struct{}, c)
	begin := time.Now()
	deadline := begin.Add(d)
	var wg sync.WaitGroup
	for i := 0; i < n && ctx.Err() == nil; i++ {
		at := begin.Add(time.Duration(float64(i) / offered * float64(time.Second)))
		if !at.Before(deadline) {
			break
		}
		if wait := time.Until(at); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		select {
		case <-ctx.Done():
		case slots <- struct{}{}:
		}
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if took, ok := timeOne(one, i, bad); ok {
				mu.Lock()
				lats = append(lats, took)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return timedLoad{elapsed: time.Since(begin), lats: lats, bad: bad}
}

// SettleResult is one /settle load phase.
type SettleResult struct {
	K, Concurrency int
	Signers        int           // signer keys the facilitator settles with
	Elapsed        time.Duration // first request to the last payment confirmed
	Confirmed      int           // answered success, or pending and then mined successfully
	Followed       int           // answers that were settlement_pending and were followed to the receipt
	Failed         int           // everything else (includes NonceErrors)
	NonceErrors    int           // failed answers whose reason or message mentions a nonce
	FirstFailed    string
	Latencies      Latencies // request to confirmation, confirmed payments only
	Chain          ChainCount
	ok             []bool // by payment: confirmed
}

// Rate is confirmed settlements per second.
func (r SettleResult) Rate() float64 { return rate(r.Confirmed, r.Elapsed) }

// settleTimeout bounds one payment, from its first request to its receipt.
const settleTimeout = 3 * time.Minute

// runSettle settles every payment from c workers. An answer that the settlement is pending (with
// its transaction) is followed on chain until mined; one still in flight without a transaction is
// asked again, with the same body, as a client would.
func runSettle(ctx context.Context, p *poster, n *node, pays []*payment, c int) SettleResult {
	var bad, nonceBad problems
	var followed atomic.Int64
	lats := make([]Latencies, c)
	confirmed := make([]bool, len(pays))
	work := make(chan int)
	begin := time.Now()
	var wg sync.WaitGroup
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				t0 := time.Now()
				ok, pending, reason := settleOne(ctx, p, n, pays[i].Body)
				if pending {
					followed.Add(1)
				}
				switch {
				case ok:
					lats[w] = append(lats[w], time.Since(t0))
					confirmed[i] = true
				case mentionsNonce(reason):
					nonceBad.add("%s", reason)
					bad.add("%s", reason)
				default:
					bad.add("%s", reason)
				}
			}
		}()
	}
	for i := range pays {
		work <- i
	}
	close(work)
	wg.Wait()
	r := SettleResult{K: len(pays), Concurrency: c, Elapsed: time.Since(begin), Followed: int(followed.Load()),
		Failed: bad.n, NonceErrors: nonceBad.n, FirstFailed: bad.first, ok: confirmed}
	for _, l := range lats {
		r.Latencies = append(r.Latencies, l...)
	}
	r.Confirmed = len(r.Latencies)
	return r
}

// settleOne settles one body until it is confirmed or definitely not; reason describes a failure.
func settleOne(ctx context.Context, p *poster, n *node, body []byte) (ok, followed bool, reason string) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for {
		var res facilitator.SettleResponse
		status, _, err := p.post(ctx, "/settle", body, &res)
		switch {
		case err != nil:
			return false, followed, err.Error()
		case status == http.StatusOK && res.Success:
			return true, followed, ""
		case res.ErrorReason == facilitator.ReasonSettlementPending && res.Transaction != "":
			followed = true
			st, err := n.receiptStatus(ctx, common.HexToHash(res.Transaction), 25*time.Millisecond)
			if err != nil {
				return false, true, "following a pending settlement: " + err.Error()
			}
			if st != 1 {
				return false, true, "pending settlement " + res.Transaction + " reverted"
			}
			return true, true, ""
		case res.ErrorReason == facilitator.ReasonSettlementPending || res.ErrorReason == facilitator.ReasonPaymentInFlight ||
			status == http.StatusServiceUnavailable:
			followed = true
			select {
			case <-ctx.Done():
				return false, true, "still " + res.ErrorReason + " at the deadline"
			case <-time.After(250 * time.Millisecond):
			}
		default:
			return false, followed, fmt.Sprintf("HTTP %d %s: %s", status, res.ErrorReason, res.ErrorMessage)
		}
	}
}

// ReplayResult is the payment-identifier replay phase: one settled payload resent n times.
type ReplayResult struct {
	N           int
	Replayed    int // answers marked as replays with the original's transaction
	FirstFailed string
	Latencies   Latencies
}

// runReplay settles pay (which carries a payment id) and then resends it n times, one at a time,
// timing each answer; a replay must come from the stored answer (facilitator.ReplayHeader) with the same
// transaction.
func runReplay(ctx context.Context, p *poster, n *node, pay *payment, count int) (ReplayResult, error) {
	r := ReplayResult{N: count}
	if ok, _, reason := settleOne(ctx, p, n, pay.Body); !ok {
		return r, fmt.Errorf("settling the payment to replay: %s", reason)
	}
	var first facilitator.SettleResponse
	if _, _, err := p.post(ctx, "/settle", pay.Body, &first); err != nil || !first.Success {
		return r, fmt.Errorf("first replay: %v %+v", err, first)
	}
	for range count {
		var res facilitator.SettleResponse
		t0 := time.Now()
		status, h, err := p.post(ctx, "/settle", pay.Body, &res)
		took := time.Since(t0)
		if err != nil || status != http.StatusOK || h.Get(facilitator.ReplayHeader) != "true" || res.Transaction != first.Transaction {
			if r.FirstFailed == "" {
				r.FirstFailed = fmt.Sprintf("HTTP %d %v replay=%q tx %s", status, err, h.Get(facilitator.ReplayHeader), res.Transaction)
			}
			continue
		}
		r.Replayed++
		r.Latencies = append(r.Latencies, took)
	}
	return r, nil
}

// decodeJSON reads a 200 answer's JSON body into out.
func decodeJSON(res *http.Response, out any) error {
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %.200s", res.StatusCode, raw)
	}
	return json.Unmarshal(raw, out)
}
