//go:build linux

package k8stest

import "testing"

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/a\040b/c`); got != "/tmp/a b/c" {
		t.Errorf("unescapeMount = %q", got)
	}
}
