package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Live is what moves on an answer page, as the page shows it and as its event stream sends it
// (event "status"): everything in words is decided here, nothing in the browser.
type Live struct {
	State         string `json:"state"`
	StateText     string `json:"stateText"`
	Advice        string `json:"advice"`
	Transaction   string `json:"transaction"`
	Block         string `json:"block"`
	Confirmations string `json:"confirmations"`
	Final         bool   `json:"final"`
	FinalText     string `json:"finalText"`
	Finality      string `json:"finality"`
	Head          string `json:"head"`
}

const none = "—"

func liveOf(st facilitator.AuthorizationStatus) Live {
	l := Live{State: st.State, StateText: st.State, Advice: facilitator.StatusAdvice(st.State), Transaction: orNone(st.Transaction),
		Block: none, Confirmations: none, Final: st.Final, FinalText: "not final yet", Head: fmt.Sprint(st.Head)}
	if st.SettledBy != "" {
		l.StateText += " (by " + st.SettledBy + ")"
	}
	if st.BlockNumber > 0 {
		l.Block, l.Confirmations = fmt.Sprint(st.BlockNumber), fmt.Sprint(st.Confirmations)
	} else {
		l.FinalText = "not on chain"
	}
	if st.Final {
		l.FinalText = "final"
	}
	l.Finality = st.Finality.Rule
	if st.Finality.FinalBlock > 0 {
		l.Finality += fmt.Sprintf(", final up to block %d", st.Finality.FinalBlock)
	} else if l.Finality != "" {
		l.Finality += ", no block known final"
	}
	return l
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

// keepAlive is how often an idle stream sends a comment, so that proxies keep it open.
const keepAlive = 15 * time.Second

// events streams an authorization's Live whenever it changes: first at once, then as read every
// Poll, until StreamFor has passed (the browser reconnects) or the answer is final.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	key, err := keyOf(r)
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	read := func() (Live, error) {
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
		defer cancel()
		st, _, err := c.cfg.Status.Authorization(ctx, key)
		return liveOf(st), err
	}
	first, err := read()
	if err != nil {
		c.errorPage(w, r, "", err)
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		c.errorPage(w, r, "", fmt.Errorf("console: the response cannot stream"))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(l Live) bool {
		b, _ := json.Marshal(l)
		_, err := fmt.Fprintf(w, "event: status\ndata: %s\n\n", b)
		fl.Flush()
		return err == nil
	}
	if !send(first) || first.Final {
		return
	}
	last, quiet := first, time.Duration(0)
	end := time.NewTimer(c.cfg.StreamFor)
	defer end.Stop()
	tick := time.NewTicker(c.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-tick.C:
		}
		l, err := read()
		if err != nil || l == last {
			// A failed read says nothing new: the page keeps what it shows.
			if quiet += c.cfg.Poll; quiet >= keepAlive {
				quiet = 0
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
					return
				}
				fl.Flush()
			}
			continue
		}
		last, quiet = l, 0
		if !send(l) || l.Final {
			return
		}
	}
}
