//go:build linux

package k8stest

import "testing"

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/a\040b/c`); got != "/tmp/a b/c" {
		t.Errorf("unescapeMount = %q", got)
	}
}

func TestCapEff(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   uint64
		ok     bool
	}{
		// This VM: root without CAP_SYS_RESOURCE (bit 24).
		{"Name:\tx\nCapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n", 0x1fffeffffff, true},
		{"CapEff:\t000001ffffffffff\n", 0x1ffffffffff, true},
		{"Name:\tx\n", 0, false},
		{"CapEff:\tzz\n", 0, false},
	} {
		got, ok := capEff(tc.status)
		if got != tc.want || ok != tc.ok {
			t.Errorf("capEff(%q) = %#x, %v; want %#x, %v", tc.status, got, ok, tc.want, tc.ok)
		}
	}
	if eff, _ := capEff("CapEff:\t000001fffeffffff\n"); eff&(1<<capSysResource) != 0 {
		t.Error("CAP_SYS_RESOURCE reported present in 0x1fffeffffff")
	}
}
