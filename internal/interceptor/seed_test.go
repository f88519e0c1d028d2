package interceptor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
)

// TestEveryAllowlistedMethodIntercepted: interception is centralized. One
// manifest binds every allowlisted method; the one server interceptor,
// with no method-specific code, shows each method's request to the
// interceptor as that method, and the veto stops each before its handler.
func TestEveryAllowlistedMethodIntercepted(t *testing.T) {
	var bindings []*gipb.InterceptorBinding
	for _, m := range interceptable {
		bindings = append(bindings, bind("v-"+m, openShellService+"/"+m, "", Validate))
	}
	f := startFake(t, manifest("", bindings...), "deny", "")
	rt := start(t, config("all", f))
	ctx := auth.NewContext(t.Context(), &auth.Principal{Kind: auth.KindUser, Subject: "alice"})
	for _, m := range interceptable {
		full := "/" + openShellService + "/" + m
		md, err := resolveRPC(openShellService + "/" + m)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
		if err != nil {
			t.Fatalf("%s input: %v", m, err)
		}
		ran := false
		_, err = rt.UnaryServerInterceptor()(ctx, mt.New().Interface(), &grpc.UnaryServerInfo{FullMethod: full}, func(context.Context, any) (any, error) {
			ran = true
			return dynamicpb.NewMessage(md.Output()), nil
		})
		if status.Code(err) != codes.FailedPrecondition || ran {
			t.Errorf("%s = %v (handler ran: %v), want the interceptor's veto before the handler", m, err, ran)
		}
	}
	evs, _ := f.evaluations(t)
	if len(evs) != len(interceptable) {
		t.Fatalf("interceptor saw %d evaluations, want %d", len(evs), len(interceptable))
	}
	for i, ev := range evs {
		if ev.GetMethod() != interceptable[i] || ev.GetBindingId() != "v-"+interceptable[i] || ev.GetValidate() == nil {
			t.Errorf("evaluation %d = %s/%s, want validate of %s", i, ev.GetMethod(), ev.GetBindingId(), interceptable[i])
		}
	}
}

// TestMapOrderNotSemantic: a patch list that only moves a map entry (remove
// then add it back, so the JSON object lists it last) yields the same
// canonical operation and the same request: map entry order is not a
// difference. The operation after a patch is canonical ProtoJSON of the
// re-encoded request.
func TestMapOrderNotSemantic(t *testing.T) {
	cur := &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh", Labels: map[string]string{"a": "1", "m": "2", "z": "3"}}, Type: "github",
	}}
	op, err := operationJSON(cur)
	if err != nil {
		t.Fatal(err)
	}
	patches := []*gipb.JsonPatch{
		{Op: "remove", Path: "/provider/metadata/labels/a"},
		{Op: "add", Path: "/provider/metadata/labels/a", Value: structpb.NewStringValue("1")},
	}
	next, nextOp, err := applyPatches(cur, op, patches)
	if err != nil {
		t.Fatal(err)
	}
	if string(nextOp) != string(op) || !proto.Equal(next, cur) {
		t.Errorf("after moving a map entry: operation %s, want %s; request equal = %v", nextOp, op, proto.Equal(next, cur))
	}
	if i, j := strings.Index(string(nextOp), `"a"`), strings.Index(string(nextOp), `"z"`); i < 0 || i > j {
		t.Errorf("canonical operation %s does not list map keys in order", nextOp)
	}
	// The candidate is re-encoded and decoded back: a field patched to its
	// default value is left out, as canonical ProtoJSON does.
	_, defOp, err := applyPatches(cur, op, []*gipb.JsonPatch{{Op: "replace", Path: "/provider/type", Value: structpb.NewStringValue("")}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(defOp), `"type"`) {
		t.Errorf("operation after setting type to its default = %s, want type left out", defOp)
	}
}

// TestPlanBuiltOnceAtStartup: Describe is called once, at Start; requests
// run on the plan built then and never ask the interceptor again.
func TestPlanBuiltOnceAtStartup(t *testing.T) {
	describes := filepath.Join(t.TempDir(), "describes")
	f := startFake(t, manifest("", bind("v", rpcCreateProvider, "", Validate)), "allow", "", "-describes", describes)
	client, _, _ := serve(t, start(t, config("once", f)))
	for range 3 {
		if _, err := client.CreateProvider(t.Context(), providerReq()); err != nil {
			t.Fatalf("CreateProvider: %v", err)
		}
	}
	b, err := os.ReadFile(describes)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "describe\n"); n != 1 {
		t.Errorf("Describe called %d times for a start and 3 requests, want 1", n)
	}
	if evs, _ := f.evaluations(t); len(evs) != 3 {
		t.Errorf("%d evaluations, want 3", len(evs))
	}
}
