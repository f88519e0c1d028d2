package cli

import (
	"testing"
)

// TestEnvTraceContext: a valid TRACEPARENT (with its TRACESTATE) becomes
// the traceparent/tracestate metadata; an unset or malformed one adds
// nothing, so a broken CI variable never reaches the gateway.
func TestEnvTraceContext(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	md := envTraceContext(env(map[string]string{"TRACEPARENT": tp, "TRACESTATE": "vendor=x"}))
	if got := md.Get("traceparent"); len(got) != 1 || got[0] != tp {
		t.Errorf("traceparent = %q, want %q", got, tp)
	}
	if got := md.Get("tracestate"); len(got) != 1 || got[0] != "vendor=x" {
		t.Errorf("tracestate = %q, want vendor=x", got)
	}
	for name, v := range map[string]string{
		"unset":        "",
		"garbage":      "not-a-traceparent",
		"zero trace":   "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"zero span":    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
		"short trace":  "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
		"version ff":   "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"header split": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nx: y",
	} {
		if md := envTraceContext(env(map[string]string{"TRACEPARENT": v})); md != nil {
			t.Errorf("%s: TRACEPARENT %q gave metadata %v, want none", name, v, md)
		}
	}
}
