package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// The receipt page (/r/{network}/{asset}/{from}/{nonce}): an authorization's public view as a page
// a payer can read, keep and print, with no key, no JavaScript and nothing of the console around
// it (no search, no navigation: it is handed to people who have no business with the console).
// The API looks the receipt up, under its public rule and limit; this only renders it.

// receiptView is what the receipt page shows.
type receiptView struct {
	Receipt   facilitator.Receipt
	Found     bool
	StateText string
	Advice    string
	Amount    string
	FinalText string
	Finality  string
	// ValidBefore is the authorization's validBefore as a UTC time, "" when unknown.
	ValidBefore string
	// TxURL and BlockURL are the transaction's and block's pages on the network's block explorer,
	// "" without one; Explorer is its host, to name the link.
	TxURL, BlockURL, Explorer string
	// Size is the delivery record's size in words, "" when not recorded.
	Size string
	// Self is the page's own path; JSON its JSON form's.
	Self, JSON string
	ReadAt     string
}

// ServeReceipt renders the receipt page of rc; found is false for an authorization known only by
// the chain's word (404, with that word).
func (c *Console) ServeReceipt(w http.ResponseWriter, r *http.Request, rc facilitator.Receipt, found bool) {
	setPageHeaders(w)
	v := c.receiptView(rc, found, time.Now())
	code := http.StatusOK
	if !found {
		code = http.StatusNotFound
	}
	c.render(w, code, "receipt", page{Title: "Receipt " + shortHex(rc.Nonce), Receipt: &v})
}

// ReceiptError renders a receipt lookup that failed, in words, under the API's status for err.
func (c *Console) ReceiptError(w http.ResponseWriter, r *http.Request, err error) {
	setPageHeaders(w)
	code := c.cfg.HTTPStatus(err)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	title, msg := "Not a receipt", facilitator.ErrorMessage(err)
	switch {
	case code == http.StatusTooManyRequests:
		title, msg = "Too many lookups", "Too many receipts were looked up from this address. Wait a minute and reload."
		w.Header().Set("Retry-After", "60")
	case code == http.StatusServiceUnavailable:
		title, msg = "Temporarily unavailable", "The facilitator cannot read its ledger or the chain right now. Nothing has changed; reload in a few seconds."
		w.Header().Set("Retry-After", "5")
	case code >= 500:
		c.log.ErrorContext(r.Context(), "receipt", "path", r.URL.Path, "status", code, "err", err)
		title, msg = "Something went wrong", "The facilitator could not answer. Reload; if it persists, tell the operator."
	}
	c.render(w, code, "receipt-error", page{Title: title, Error: &errorView{Status: code, Title: title, Message: msg}})
}

// setPageHeaders are the console's page headers: its CSP, no sniffing, no referrer (the page's
// URL names a payment; a click to the explorer must not hand it over).
func setPageHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

func (c *Console) receiptView(rc facilitator.Receipt, found bool, now time.Time) receiptView {
	v := receiptView{Receipt: rc, Found: found, StateText: rc.State, Advice: facilitator.StatusAdvice(rc.State),
		Amount: c.amount(rc.Network, rc.Asset, rc.Value), FinalText: "not final yet",
		Self: ReceiptPath(rc.Network, rc.Asset, rc.Authorizer, rc.Nonce), ReadAt: now.UTC().Format("2006-01-02 15:04:05 UTC")}
	v.JSON = v.Self + ".json"
	if rc.SettledBy == "facilitator" {
		v.StateText += " by this facilitator"
	} else if rc.SettledBy == "other" {
		v.StateText += " by another party"
	}
	if rc.BlockNumber == 0 {
		v.FinalText = "not on chain"
	} else if rc.Final {
		v.FinalText = "final"
	}
	v.Finality = rc.Finality.Rule
	if rc.Finality.FinalBlock > 0 {
		v.Finality += fmt.Sprintf(", final up to block %d", rc.Finality.FinalBlock)
	}
	if secs, ok := unixSeconds(rc.ValidBefore); ok {
		v.ValidBefore = time.Unix(secs, 0).UTC().Format("2006-01-02 15:04:05 UTC")
	}
	for _, n := range c.cfg.Networks {
		if n.ID != rc.Network || n.Explorer == "" {
			continue
		}
		if u, err := url.Parse(n.Explorer); err == nil {
			v.Explorer = u.Host
		}
		if rc.Transaction != "" {
			v.TxURL = n.Explorer + "/tx/" + rc.Transaction
		}
		if rc.BlockNumber > 0 {
			v.BlockURL = fmt.Sprintf("%s/block/%d", n.Explorer, rc.BlockNumber)
		}
	}
	if d := rc.Delivery; d != nil && d.Size != nil {
		v.Size = fmt.Sprintf("%d bytes", *d.Size)
	}
	return v
}

// unixSeconds reads a validBefore (decimal seconds) that a time can show; false past year 9999.
func unixSeconds(s string) (int64, bool) {
	if s == "" || len(s) > 11 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	var n int64
	for _, r := range s {
		n = n*10 + int64(r-'0')
	}
	return n, n < 253402300800
}

// ReceiptPath is the receipt page's path of an authorization: short, stable, and the same in
// every mode (the network's colon escaped, as the API's own links write it).
func ReceiptPath(network, asset, from, nonce string) string {
	return "/r/" + url.PathEscape(network) + "/" + asset + "/" + from + "/" + nonce
}
