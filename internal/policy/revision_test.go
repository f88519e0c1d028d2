package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func TestRecordRoundTrip(t *testing.T) {
	p := baselinePolicy()
	now := time.UnixMilli(1700000000000)
	rec, err := BaselineRecord("sb-1", p, now)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Type != RecordType || rec.Scope != "sb-1" || rec.Status != "POLICY_STATUS_PENDING" || rec.ID != BaselineRecordID("sb-1") {
		t.Fatalf("BaselineRecord() = %+v", rec)
	}
	if BaselineRecordID("sb-1") == BaselineRecordID("sb-2") {
		t.Fatal("BaselineRecordID is the same for two sandboxes")
	}
	rec.Version = 1
	rev, err := DecodeRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := &openshellv1.SandboxPolicyRevision{
		Version: 1, PolicyHash: Hash(p), Status: openshellv1.PolicyStatus_POLICY_STATUS_PENDING,
		CreatedAtMs: now.UnixMilli(), Policy: p,
	}
	if diff := cmp.Diff(want, rev, protocmp.Transform()); diff != "" {
		t.Errorf("DecodeRecord() mismatch (-want +got):\n%s", diff)
	}
	rev.Status = openshellv1.PolicyStatus_POLICY_STATUS_FAILED
	if err := EncodeRecord(&rec, rev); err != nil {
		t.Fatal(err)
	}
	if rec.Status != "POLICY_STATUS_FAILED" {
		t.Errorf("EncodeRecord() status = %q, want POLICY_STATUS_FAILED", rec.Status)
	}
}
