package services

import "testing"

func TestParseHost(t *testing.T) {
	domains := []string{"openshell.localhost", "apps.example.com"}
	tests := []struct {
		host string
		want Target
		ok   bool
	}{
		{"sb--web.openshell.localhost", Target{"default", "sb", "web"}, true},
		{"sb--web.openshell.localhost:17670", Target{"default", "sb", "web"}, true},
		{"SB--Web.Apps.Example.Com.", Target{"default", "sb", "web"}, true},
		{"sb.openshell.localhost", Target{"default", "sb", ""}, true},
		{"sb--web--team.apps.example.com", Target{"team", "sb", "web"}, true},
		{"sb----team.apps.example.com", Target{"team", "sb", ""}, true},
		{"sb--.openshell.localhost", Target{}, false},
		{"sb--web--default.openshell.localhost", Target{}, false},
		{"a--b--c--d.openshell.localhost", Target{}, false},
		{"x.sb--web.openshell.localhost", Target{}, false},
		{"openshell.localhost", Target{}, false},
		{"sb--web.other.localhost", Target{}, false},
		{"127.0.0.1:17670", Target{}, false},
		{"-sb--web.openshell.localhost", Target{}, false},
	}
	for _, tt := range tests {
		got, ok := parseHost(tt.host, domains)
		if ok != tt.ok || got != tt.want {
			t.Errorf("parseHost(%q) = %+v, %v; want %+v, %v", tt.host, got, ok, tt.want, tt.ok)
		}
	}
}
