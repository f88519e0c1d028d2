package server

import (
	"context"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// ServiceLogin is the OIDC browser login of service hosts
// (internal/auth/oidc.Login). Values it returns are sealed for one origin
// ("http(s)://<host>[:port]"): a session of one service host, or of its
// TLS side, is refused on another.
type ServiceLogin interface {
	// Start begins a login for origin: the issuer URL to send the browser
	// to and the sealed login state to keep in a cookie.
	Start(ctx context.Context, origin, redirectURI, returnTo string) (authURL, state string, err error)
	// Finish completes it from the callback's query and the login state:
	// a sealed session for origin, its expiry and the path to return to.
	// InvalidArgument: bad or mismatched state; Unauthenticated: the
	// issuer or the ID token refused; Unavailable: issuer unreachable.
	Finish(ctx context.Context, origin, state string, query url.Values) (session string, expires time.Time, returnTo string, err error)
	// Session opens a session cookie value for origin: (nil, nil) when it
	// has expired, Unauthenticated when it is not a session for origin.
	Session(origin, value string) (*auth.Principal, error)
}

// requestOrigin is the origin a login value is sealed for.
func requestOrigin(r *http.Request, tlsConn bool) string {
	if tlsConn {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

// Paths of the browser login on every service host; they shadow the
// app's own paths of the same name.
const (
	LoginCallbackPath = "/.openshell/oidc/callback"
	LogoutPath        = "/.openshell/oidc/logout"
	loginPathPrefix   = "/.openshell/oidc/"
)

// loginCookies are the cookie names on one connection kind: with TLS the
// __Host- prefix makes browsers keep them Secure, host-only and Path=/.
type loginCookies struct {
	session, state string
	secure         bool
}

func cookiesFor(tlsConn bool) loginCookies {
	if tlsConn {
		return loginCookies{session: "__Host-openshell-session", state: "__Host-openshell-login", secure: true}
	}
	return loginCookies{session: "openshell-session", state: "openshell-login"}
}

func (lc loginCookies) set(w http.ResponseWriter, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: lc.secure, SameSite: http.SameSiteLaxMode})
}

// sessionPrincipal returns the principal of r's session cookie: (nil, nil)
// without one or when it expired, Unauthenticated for a cookie that is
// not a session of this gateway for r's host.
func (s *Server) sessionPrincipal(r *http.Request, tlsConn bool) (*auth.Principal, error) {
	for _, c := range r.CookiesNamed(cookiesFor(tlsConn).session) {
		if c.Value != "" {
			return s.opts.ServiceLogin.Session(requestOrigin(r, tlsConn), c.Value)
		}
	}
	return nil, nil
}

// isNavigation reports whether r is a browser loading a page (not a
// script's fetch): only those are sent to the issuer to log in.
func isNavigation(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if mode := r.Header.Get("Sec-Fetch-Mode"); mode != "" {
		return mode == "navigate"
	}
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

// startLogin sends a browser to the issuer, keeping the login state in a
// short-lived cookie.
func (s *Server) startLogin(w http.ResponseWriter, r *http.Request, tlsConn bool) {
	lc := cookiesFor(tlsConn)
	origin := requestOrigin(r, tlsConn)
	authURL, state, err := s.opts.ServiceLogin.Start(r.Context(), origin, origin+LoginCallbackPath, r.URL.RequestURI())
	if err != nil {
		s.log.Warn("service login start", "host", r.Host, "error", err)
		serviceError(w, http.StatusBadGateway, "Login is not available")
		return
	}
	lc.set(w, lc.state, state, 600)
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, authURL, http.StatusFound)
}

// serveLogin answers the login paths of a service host.
func (s *Server) serveLogin(w http.ResponseWriter, r *http.Request, tlsConn bool) {
	lc := cookiesFor(tlsConn)
	w.Header().Set("Cache-Control", "no-store")
	switch r.URL.Path {
	case LogoutPath:
		lc.set(w, lc.session, "", -1)
		serviceError(w, http.StatusOK, "Signed out")
	case LoginCallbackPath:
		s.finishLogin(w, r, lc, tlsConn)
	default:
		serviceError(w, http.StatusNotFound, "Not found")
	}
}

func (s *Server) finishLogin(w http.ResponseWriter, r *http.Request, lc loginCookies, tlsConn bool) {
	if r.Method != http.MethodGet {
		serviceError(w, http.StatusMethodNotAllowed, "Method not allowed")
		return
	}
	var state string
	if c, err := r.Cookie(lc.state); err == nil {
		state = c.Value
	}
	lc.set(w, lc.state, "", -1) // one use, whatever happens
	session, expires, returnTo, err := s.opts.ServiceLogin.Finish(r.Context(), requestOrigin(r, tlsConn), state, r.URL.Query())
	if err != nil {
		code, msg := http.StatusInternalServerError, "Login failed"
		switch {
		case errors.Is(err, errdefs.ErrInvalidArgument):
			code, msg = http.StatusBadRequest, "Login failed: the login state is missing, expired or does not match; open the page again"
		case errors.Is(err, errdefs.ErrUnauthenticated):
			code = http.StatusUnauthorized
		case errors.Is(err, errdefs.ErrUnavailable):
			code = http.StatusBadGateway
		}
		s.log.Info("service login refused", "host", r.Host, "error", err)
		serviceError(w, code, msg)
		return
	}
	lc.set(w, lc.session, session, int(time.Until(expires).Seconds()))
	s.log.Info("service login", "host", r.Host)
	if tlsConn {
		http.Redirect(w, r, returnTo, http.StatusSeeOther)
		return
	}
	// On the loopback plaintext path the redirect chain went through the
	// issuer, and Fetch Metadata may then call the next request
	// cross-site, which the path refuses; a page of this origin that
	// moves on by itself makes the next request same-origin.
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_ = continuePage.Execute(w, returnTo)
}

var continuePage = template.Must(template.New("continue").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={{.}}"><title>Signed in</title></head>
<body><p>Signed in. <a href="{{.}}">Continue</a></p></body></html>
`))

// stripLoginCookies removes the gateway's login cookies from the request
// the app will see.
func stripLoginCookies(r *http.Request) {
	vals := r.Header.Values("Cookie")
	if len(vals) == 0 {
		return
	}
	ours := func(name string) bool {
		for _, lc := range []loginCookies{cookiesFor(true), cookiesFor(false)} {
			if name == lc.session || name == lc.state {
				return true
			}
		}
		return false
	}
	var keep []string
	for _, c := range r.Cookies() {
		if !ours(c.Name) {
			keep = append(keep, c.String())
		}
	}
	r.Header.Del("Cookie")
	if len(keep) > 0 {
		r.Header.Set("Cookie", strings.Join(keep, "; "))
	}
}

// crossSiteForSession returns why a request carrying the session cookie
// must not use it, or "". The cookie is SameSite=Lax, which browsers
// still send from sibling hosts (other sandboxes' apps under the same
// domain are the same site), so the session only counts for requests of
// the host's own pages and for plain page loads: Sec-Fetch-Site
// same-site or cross-site is refused unless the request is a GET or HEAD
// navigation; without Fetch Metadata, an Origin other than the host's.
func crossSiteForSession(r *http.Request, origin string) string {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "same-origin", "none":
		return ""
	case "":
		if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, strings.ToLower(origin)) {
			return "origin"
		}
		return ""
	default:
		if r.Header.Get("Sec-Fetch-Mode") == "navigate" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			return ""
		}
		return "sec-fetch-site " + site
	}
}
