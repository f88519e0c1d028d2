package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestIsNavigation(t *testing.T) {
	for _, tt := range []struct {
		name, method string
		hdr          map[string]string
		want         bool
	}{
		{"fetch metadata navigate", http.MethodGet, map[string]string{"Sec-Fetch-Mode": "navigate"}, true},
		{"fetch metadata cors", http.MethodGet, map[string]string{"Sec-Fetch-Mode": "cors", "Accept": "text/html"}, false},
		{"no fetch metadata, html", http.MethodGet, map[string]string{"Accept": "text/html,application/xhtml+xml"}, true},
		{"no fetch metadata, json", http.MethodGet, map[string]string{"Accept": "application/json"}, false},
		{"post form", http.MethodPost, map[string]string{"Sec-Fetch-Mode": "navigate"}, false},
	} {
		r := httptest.NewRequest(tt.method, "http://web--app.openshell.localhost/", nil)
		for k, v := range tt.hdr {
			r.Header.Set(k, v)
		}
		if got := isNavigation(r); got != tt.want {
			t.Errorf("%s: isNavigation() = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestStripLoginCookies(t *testing.T) {
	for in, want := range map[string]string{
		"openshell-session=a; app=1; __Host-openshell-login=b":  "app=1",
		"__Host-openshell-session=a; openshell-login=b":         "",
		`app="quoted value"; theme=dark; openshell-session=zzz`: `app="quoted value"; theme=dark`,
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Cookie", in)
		stripLoginCookies(r)
		if got := r.Header.Get("Cookie"); got != want {
			t.Errorf("stripLoginCookies(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCrossSiteForSession(t *testing.T) {
	const origin = "https://web--app.apps.example.com"
	for _, tt := range []struct {
		name, method string
		hdr          map[string]string
		refused      bool
	}{
		{"own page's fetch", http.MethodPost, map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}, false},
		{"typed address", http.MethodGet, map[string]string{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}, false},
		{"link from a sibling app", http.MethodGet, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}, false},
		{"sibling app's fetch", http.MethodGet, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}, true},
		{"sibling app's form post", http.MethodPost, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}, true},
		{"sibling app's websocket", http.MethodGet, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "websocket"}, true},
		{"cross-site image", http.MethodGet, map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}, true},
		{"no fetch metadata, foreign origin", http.MethodPost, map[string]string{"Origin": "https://evil--app.apps.example.com"}, true},
		{"no fetch metadata, own origin", http.MethodPost, map[string]string{"Origin": origin}, false},
		{"no fetch metadata, no origin", http.MethodGet, nil, false},
	} {
		r := httptest.NewRequest(tt.method, origin+"/", nil)
		for k, v := range tt.hdr {
			r.Header.Set(k, v)
		}
		if got := crossSiteForSession(r, origin) != ""; got != tt.refused {
			t.Errorf("%s: refused = %v, want %v", tt.name, got, tt.refused)
		}
	}
}
