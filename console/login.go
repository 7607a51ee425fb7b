package console

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// Browser login: the API key, typed once into the form, opens a session. The browser keeps only
// the session's random token, in an HttpOnly, SameSite=Strict cookie scoped to /console, which
// the API's guard accepts on the console's pages only; logging out revokes the session, so a
// copy of the cookie opens nothing after. The key is never kept, logged, echoed into a page or
// put in a URL.

// Sessions opens and ends login sessions: api.ConsoleSessions.
type Sessions interface {
	// Login checks key, typed in from the client address client, and opens a session: its token
	// and when it expires. A refusal is a facilitator.Error (401, 403, 429 with its wait, 503).
	Login(ctx context.Context, client, key string) (token string, expires time.Time, err error)
	// Logout revokes the session of token.
	Logout(ctx context.Context, token string) error
}

type loginView struct {
	Open    bool // open mode: no key is needed
	Next    string
	Message string
}

// maxLoginBody bounds the login form: a key and a path.
const maxLoginBody = 4 << 10

// sameOrigin refuses a POST another site's page made the browser send. SameSite=Strict already
// keeps the cookie off such requests; this also stops one from logging the browser in with a key
// of the attacker's choosing, or out.
func sameOrigin(r *http.Request) bool {
	// Browsers that send Sec-Fetch-Site say it best; under the pages' no-referrer policy their
	// Origin is "null" even for the console's own forms. Older ones are judged by Origin.
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" {
		return s == "same-origin" || s == "none"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

// nextPath is where a login sends the browser: a path of the console's own, never another site
// (no open redirect: "//evil", "/\evil", absolute URLs and paths that climb out with dot segments
// fall back to the console's start).
func nextPath(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || strings.ContainsAny(s, "\\\r\n") ||
		strings.HasPrefix(s, "//") || (u.Path != "/console" && !strings.HasPrefix(u.Path, "/console/")) ||
		u.Path == "/console/login" || u.Path == "/console/logout" || dotSegments(u.Path) {
		return "/console"
	}
	return u.RequestURI()
}

// dotSegments reports whether a (decoded) path has a "." or ".." segment: a browser resolves
// "/console/../x" and "/console/%2e%2e/x" to "/x", off the console.
func dotSegments(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// sessionCookie holds a session's token. Without MaxAge it ends with the browser, and the
// session itself ends sooner on the server (expiry, logout, the key's revocation).
func (c *Console) sessionCookie(r *http.Request, token string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: facilitator.ConsoleSessionCookie, Value: token, Path: "/console", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
}

// clientAddress is the client's address as the API resolved it (the TCP peer's, or behind a
// trusted proxy the address it forwarded for), so that logins are limited by the API guard's key;
// the TCP peer's when the console is served without the API in front.
func clientAddress(r *http.Request) string {
	if a := facilitator.ClientAddressFrom(r.Context()); a != "" {
		return a
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	c.renderLogin(w, http.StatusOK, loginView{Next: nextPath(r.URL.Query().Get("next"))})
}

func (c *Console) renderLogin(w http.ResponseWriter, code int, v loginView) {
	v.Open = c.cfg.Sessions == nil
	c.render(w, code, "login", page{Title: "Log in", Login: &v})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.render(w, http.StatusForbidden, "error", page{Title: "Refused", Error: &errorView{Status: http.StatusForbidden,
			Title: "Refused", Message: "This form can only be sent from the console's own page."}})
		return
	}
	if c.cfg.Sessions == nil {
		http.Redirect(w, r, "/console", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		c.renderLogin(w, http.StatusBadRequest, loginView{Next: "/console", Message: "The form could not be read; try again."})
		return
	}
	next := nextPath(r.PostForm.Get("next"))
	key := strings.TrimSpace(r.PostForm.Get("key"))
	if key == "" || len(key) > 256 || strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r > '~' || r == ';' || r == '"' || r == '\\' || r == ',' }) {
		c.renderLogin(w, http.StatusUnauthorized, loginView{Next: next, Message: "That is not an API key: it looks like x402_<id>_<secret>."})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	token, _, err := c.cfg.Sessions.Login(ctx, clientAddress(r), key)
	if err != nil {
		code := c.cfg.HTTPStatus(err)
		msg := "That key was not accepted: it is unknown, revoked or mistyped."
		switch {
		case code == http.StatusForbidden:
			msg = "That key may not read the console: it lacks the status scope."
		case code == http.StatusTooManyRequests:
			wait := int((facilitator.ErrorRetryAfter(err) + time.Second - 1) / time.Second)
			wait = max(wait, 1)
			w.Header().Set("Retry-After", strconv.Itoa(wait))
			msg = "Too many login attempts: try again in " + strconv.Itoa(wait) + " s."
		case code >= 500 || code == 0:
			code, msg = http.StatusServiceUnavailable, "Keys cannot be checked right now; try again in a few seconds."
			c.log.ErrorContext(r.Context(), "console: logging in", "err", err) // the error never holds the key
		}
		c.renderLogin(w, code, loginView{Next: next, Message: msg})
		return
	}
	http.SetCookie(w, c.sessionCookie(r, token, 0))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout revokes the session on the server, then clears the cookie: a copy of it kept elsewhere
// opens nothing after.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.render(w, http.StatusForbidden, "error", page{Title: "Refused", Error: &errorView{Status: http.StatusForbidden,
			Title: "Refused", Message: "This form can only be sent from the console's own page."}})
		return
	}
	if ck, err := r.Cookie(facilitator.ConsoleSessionCookie); err == nil && c.cfg.Sessions != nil {
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
		defer cancel()
		if err := c.cfg.Sessions.Logout(ctx, ck.Value); err != nil {
			// The cookie is kept: cleared, it would look logged out while its session still opens pages.
			c.log.ErrorContext(r.Context(), "console: logging out", "err", err) // the error never holds the token
			c.render(w, http.StatusServiceUnavailable, "error", page{Title: "Not logged out", Error: &errorView{Status: http.StatusServiceUnavailable,
				Title: "Not logged out", Message: "The session could not be ended right now; try again in a few seconds."}})
			return
		}
	}
	http.SetCookie(w, c.sessionCookie(r, "", -1))
	http.Redirect(w, r, "/console/login", http.StatusSeeOther)
}

// Refused answers a console page the API's guard turned away: without a usable key, the login
// form (a bad cookie is cleared), with a message and a way back to the page; otherwise the
// error page under the API's status.
func (c *Console) Refused(w http.ResponseWriter, r *http.Request, err error) {
	w.Header().Set("Content-Security-Policy", CSP)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	code := c.cfg.HTTPStatus(err)
	if code != http.StatusUnauthorized {
		title, msg := "Refused", facilitator.ErrorMessage(err)
		switch code {
		case http.StatusForbidden:
			title = "Not allowed"
		case http.StatusTooManyRequests:
			title = "Too many requests"
		default:
			c.errorPage(w, r, "", err)
			return
		}
		c.render(w, code, "error", page{Title: title, Error: &errorView{Status: code, Title: title, Message: msg}})
		return
	}
	msg := "Log in with an API key that has the status scope to see this page."
	if _, noCookie := r.Cookie(facilitator.ConsoleSessionCookie); noCookie == nil {
		http.SetCookie(w, c.sessionCookie(r, "", -1))
		msg = "Your session has ended (logged out, expired, or its key revoked): log in again."
	}
	next := "/console"
	if r.Method == http.MethodGet {
		next = nextPath(r.URL.RequestURI())
	}
	c.renderLogin(w, http.StatusUnauthorized, loginView{Next: next, Message: msg})
}
