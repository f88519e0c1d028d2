package oidctest

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
)

// post sends form to the issuer's endpoint path and returns the decoded
// JSON answer and the HTTP status.
func post(t *testing.T, is *Issuer, path string, form url.Values) (map[string]any, int) {
	t.Helper()
	resp, err := http.PostForm(is.URL+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return m, resp.StatusCode
}

// TestOptionsGrants: the grants Options turn on, and their refusals.
func TestOptionsGrants(t *testing.T) {
	is := NewWithOptions(t, "cli", "", Options{Refresh: true, ServiceClientID: "bot", ServiceSecret: "bot-secret",
		DeviceUser: User{Subject: "dave"}, Revocation: true})
	errCode := func(m map[string]any) any { return m["error"] }

	if m, _ := post(t, is, "/token", url.Values{"grant_type": {"client_credentials"}, "client_id": {"bot"}, "client_secret": {"wrong"}}); errCode(m) != "invalid_client" {
		t.Errorf("client credentials with a wrong secret = %v, want invalid_client", m)
	}
	if m, _ := post(t, is, "/token", url.Values{"grant_type": {"client_credentials"}, "client_id": {"cli"}}); errCode(m) != "unauthorized_client" {
		t.Errorf("client credentials for the public client = %v, want unauthorized_client", m)
	}
	if m, code := post(t, is, "/token", url.Values{"grant_type": {"client_credentials"}, "client_id": {"bot"}, "client_secret": {"bot-secret"}}); code != http.StatusOK || m["access_token"] == nil || m["refresh_token"] != nil {
		t.Errorf("client credentials = %d %v, want an access token and no refresh token", code, m)
	}

	dev, _ := post(t, is, "/device", url.Values{"client_id": {"cli"}})
	poll := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:device_code"}, "client_id": {"cli"}, "device_code": {dev["device_code"].(string)}}
	if m, _ := post(t, is, "/token", poll); errCode(m) != "authorization_pending" {
		t.Errorf("first device poll = %v, want authorization_pending", m)
	}
	m, _ := post(t, is, "/token", poll)
	rt, _ := m["refresh_token"].(string)
	if m["access_token"] == nil || rt == "" {
		t.Fatalf("second device poll = %v, want tokens", m)
	}

	refresh := url.Values{"grant_type": {"refresh_token"}, "client_id": {"cli"}, "refresh_token": {rt}}
	m, _ = post(t, is, "/token", refresh)
	next, _ := m["refresh_token"].(string)
	if next == "" || next == rt {
		t.Fatalf("refresh = %v, want a new refresh token", m)
	}
	if m, _ := post(t, is, "/token", refresh); errCode(m) != "invalid_grant" {
		t.Errorf("second use of a refresh token = %v, want invalid_grant (rotation)", m)
	}
	post(t, is, "/revoke", url.Values{"token": {next}, "token_type_hint": {"refresh_token"}})
	if m, _ := post(t, is, "/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {"cli"}, "refresh_token": {next}}); errCode(m) != "invalid_grant" {
		t.Errorf("refresh with a revoked token = %v, want invalid_grant", m)
	}
	if r := is.RevokeRequests(); len(r) != 1 || r[0].Get("token") != next {
		t.Errorf("RevokeRequests() = %v, want the one revocation", r)
	}
	if n := len(is.TokenRequests()); n != 8 {
		t.Errorf("len(TokenRequests()) = %d, want 8", n)
	}
}
