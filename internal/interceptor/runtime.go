package interceptor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// UnaryServerInterceptor runs the plan around the handler. It must run
// after authentication and authorization (the principal is read from the
// context): the gateway chains it after its own pipeline.
func (r *Runtime) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return r.intercept
}

func (r *Runtime) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod
	mods, vals, posts := r.plan[key{method, ModifyOperation}], r.plan[key{method, Validate}], r.plan[key{method, PostCommit}]
	if len(mods)+len(vals)+len(posts) == 0 {
		return handler(ctx, req)
	}
	cur, ok := req.(proto.Message)
	if !ok {
		return handler(ctx, req)
	}
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	base := &gipb.InterceptorEvaluation{Service: svc, Method: name, Principal: principalMap(ctx)}
	op, err := operationJSON(cur)
	if err != nil {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("request cannot be shown to interceptors: %v", err))
	}
	for _, b := range mods {
		res, err := r.ask(ctx, base, b, op)
		if err != nil {
			return nil, err
		}
		if len(res.GetPatches()) == 0 {
			continue
		}
		next, nextOp, err := applyPatches(cur, op, res.GetPatches())
		if err != nil {
			// Fail-open keeps cur and op: the exact pre-binding operation.
			if ferr := r.failed(ctx, b, fmt.Errorf("invalid modification: %w", err)); ferr != nil {
				return nil, errdefs.InvalidArgument(fmt.Sprintf("interceptor %q binding %q: invalid modification: %v", b.interceptor, b.id, err))
			}
			continue
		}
		cur, op = next, nextOp
	}
	for _, b := range vals {
		if _, err := r.ask(ctx, base, b, op); err != nil {
			return nil, err
		}
	}
	resp, err := handler(ctx, cur)
	if err != nil || len(posts) == 0 {
		return resp, err
	}
	r.observe(ctx, base, posts, resp)
	return resp, nil
}

// ask evaluates one binding before dispatch with the operation op. It
// returns the result to act on, nil when a fail_open failure lets the call
// go on, or the error that refuses the call.
func (r *Runtime) ask(ctx context.Context, base *gipb.InterceptorEvaluation, b binding, op []byte) (*gipb.InterceptorResult, error) {
	st, err := toStruct(op)
	if err != nil {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("request cannot be shown to interceptors: %v", err))
	}
	phase := &gipb.InterceptorEvaluation{Phase: &gipb.InterceptorEvaluation_ModifyOperation{ModifyOperation: &gipb.ModifyOperationEvaluation{ProposedOperation: st}}}
	if b.phase == Validate {
		// current_state stays absent: no method loads state for interceptors yet.
		phase.Phase = &gipb.InterceptorEvaluation_Validate{Validate: &gipb.ValidateEvaluation{ProposedOperation: st}}
	}
	res, err := r.evaluate(ctx, b, evaluation(base, b, phase))
	if err != nil {
		return nil, r.failed(ctx, b, err)
	}
	if !res.GetAllowed() {
		return nil, r.denied(ctx, b, res)
	}
	return res, nil
}

// observe shows the committed response to the post_commit bindings. Nothing
// it does changes the response.
func (r *Runtime) observe(ctx context.Context, base *gipb.InterceptorEvaluation, posts []binding, resp any) {
	var st *structpb.Struct
	m, ok := resp.(proto.Message)
	var err error
	if !ok {
		err = fmt.Errorf("response %T is not a protobuf message", resp)
	} else {
		var js []byte
		if js, err = operationJSON(m); err == nil {
			st, err = toStruct(js)
		}
	}
	for _, b := range posts {
		if err != nil {
			r.metrics.postCommitFailures.WithLabelValues(b.interceptor, b.id).Inc()
			r.log.WarnContext(ctx, "post-commit observation failed", "interceptor", b.interceptor, "binding", b.id, "method", base.GetMethod(), "err", err)
			continue
		}
		ev := evaluation(base, b, &gipb.InterceptorEvaluation{Phase: &gipb.InterceptorEvaluation_PostCommit{PostCommit: &gipb.PostCommitEvaluation{CommittedResponse: st}}})
		if _, eerr := r.evaluate(context.WithoutCancel(ctx), b, ev); eerr != nil {
			r.metrics.postCommitFailures.WithLabelValues(b.interceptor, b.id).Inc()
			_ = r.failed(ctx, b, eerr) // post_commit bindings are fail_open
		}
	}
}

func evaluation(base *gipb.InterceptorEvaluation, b binding, phase *gipb.InterceptorEvaluation) *gipb.InterceptorEvaluation {
	ev := proto.Clone(base).(*gipb.InterceptorEvaluation)
	ev.InterceptorName, ev.BindingId, ev.Phase = b.interceptor, b.id, phase.Phase
	return ev
}

// errInvalidResult marks a result that breaks the contract of its phase.
var errInvalidResult = errors.New("invalid interceptor result")

// evaluate asks the interceptor and checks the result against the phase.
func (r *Runtime) evaluate(ctx context.Context, b binding, ev *gipb.InterceptorEvaluation) (*gipb.InterceptorResult, error) {
	cctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	res, err := b.client.Evaluate(cctx, ev)
	if err != nil {
		r.metrics.evaluations.WithLabelValues(b.interceptor, b.id, phaseName(b.phase), "error").Inc()
		return nil, err
	}
	switch {
	case len(res.GetPatches()) > 0 && b.phase != ModifyOperation:
		err = fmt.Errorf("%w: patches in phase %s", errInvalidResult, phaseName(b.phase))
	case len(res.GetPatches()) > b.maxPatches:
		err = fmt.Errorf("%w: %d patches, at most %d", errInvalidResult, len(res.GetPatches()), b.maxPatches)
	case !res.GetAllowed() && b.phase == PostCommit:
		err = fmt.Errorf("%w: post_commit cannot deny", errInvalidResult)
	case !res.GetAllowed() && res.GetStatusCode() != "":
		if _, ok := codeByName(res.GetStatusCode()); !ok {
			err = fmt.Errorf("%w: status_code %q is not a gRPC error code name", errInvalidResult, res.GetStatusCode())
		}
	}
	if err != nil {
		r.metrics.evaluations.WithLabelValues(b.interceptor, b.id, phaseName(b.phase), "error").Inc()
		return nil, err
	}
	outcome := "allow"
	if !res.GetAllowed() {
		outcome = "deny"
	}
	r.metrics.evaluations.WithLabelValues(b.interceptor, b.id, phaseName(b.phase), outcome).Inc()
	if r.log.Enabled(ctx, slog.LevelDebug) {
		attrs := []any{"interceptor", b.interceptor, "binding", b.id, "phase", phaseName(b.phase), "outcome", outcome, "patches", len(res.GetPatches())}
		for k, v := range res.GetLogAnnotations() {
			attrs = append(attrs, "annotation."+k, v)
		}
		r.log.DebugContext(ctx, "interceptor evaluated", attrs...)
	}
	return res, nil
}

// failed applies the binding's failure policy to err: nil lets the call
// go on (fail_open), otherwise the call is refused before dispatch.
func (r *Runtime) failed(ctx context.Context, b binding, err error) error {
	if b.failurePolicy == FailOpen {
		r.metrics.failOpen.WithLabelValues(b.interceptor, b.id, phaseName(b.phase)).Inc()
		r.log.WarnContext(ctx, "interceptor failed; fail_open lets the call through", "interceptor", b.interceptor, "binding", b.id, "phase", phaseName(b.phase), "err", err)
		return nil
	}
	r.log.WarnContext(ctx, "interceptor failed; fail_closed refuses the call", "interceptor", b.interceptor, "binding", b.id, "phase", phaseName(b.phase), "err", err)
	return errdefs.Unavailable(fmt.Sprintf("interceptor %q binding %q failed (fail_closed)", b.interceptor, b.id))
}

func (r *Runtime) denied(ctx context.Context, b binding, res *gipb.InterceptorResult) error {
	code := codes.PermissionDenied
	if n, ok := codeByName(res.GetStatusCode()); ok {
		code = codes.Code(n)
	}
	reason := strings.TrimSpace(res.GetReason())
	if reason == "" {
		reason = "operation denied by gateway interceptor"
	}
	r.log.InfoContext(ctx, "interceptor denied the call", "interceptor", b.interceptor, "binding", b.id, "phase", phaseName(b.phase), "code", code.String())
	return status.Error(code, reason)
}

// toStruct turns a ProtoJSON object into a Struct.
func toStruct(js []byte) (*structpb.Struct, error) {
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		return nil, err
	}
	return structpb.NewStruct(m)
}

// principalMap is the non-secret summary of the caller, with OpenShell's
// keys and values: kind "user" (subject, display_name, provider, roles,
// scopes) or "sandbox" (sandbox_id, source: how the supervisor
// authenticated, bootstrap_jwt or k8s_service_account), "unknown" when no
// principal is known. Lists are joined with commas; empty values are left
// out.
func principalMap(ctx context.Context) map[string]string {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return map[string]string{"kind": "unknown"}
	}
	if p.IsSandbox() {
		src := string(p.Source)
		if p.Source == auth.SourceSandboxJWT {
			src = "bootstrap_jwt" // OpenShell's name for a gateway-minted sandbox JWT
		}
		return map[string]string{"kind": "sandbox", "sandbox_id": p.SandboxID, "source": src}
	}
	m := map[string]string{"kind": "user", "subject": p.Subject}
	for k, v := range map[string]string{
		"display_name": p.DisplayName, "provider": string(p.Source),
		"roles": strings.Join(p.Roles, ","), "scopes": strings.Join(p.Scopes, ","),
	} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}
