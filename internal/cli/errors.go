package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var errEOF = io.EOF

// databaseUnavailable ends the message of the Unavailable errors a gateway
// returns while its database cannot be reached.
const databaseUnavailable = "database unavailable"

// userError is an error already phrased for a person.
type userError struct {
	msg   string
	cause error
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.cause }

// rpcError turns a gRPC error from the gateway into a sentence with a hint.
// what names the object the caller asked for ("sandbox \"foo\""), or is ""
// when the RPC is not about one object.
func (a *app) rpcError(err error, what string) error {
	if err == nil {
		return nil
	}
	var ue *userError
	if errors.As(err, &ue) {
		return err
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	t := gatewayTarget{Name: "", Endpoint: "(unresolved)"}
	if a.target != nil {
		t = *a.target
	}
	msg := st.Message()
	var out string
	switch st.Code() {
	case codes.Unavailable:
		if strings.HasSuffix(msg, databaseUnavailable) {
			// The gateway answered: it is up, its database is not.
			out = fmt.Sprintf("%s is up, but its database is unavailable: %s (the gateway's log says why; requests succeed again once the database is back)", t.describe(), msg)
			break
		}
		reason := dialReason(msg)
		hint := "is openshell-gateway running?"
		switch {
		case strings.Contains(reason, "certificate required"), strings.Contains(reason, "bad certificate"):
			hint = "the gateway requires a client certificate: register it with 'openshell gateway add NAME --endpoint URL --ca ca.crt --cert tls.crt --key tls.key'"
		case strings.Contains(reason, "unknown authority"), strings.Contains(reason, "certificate is not valid"):
			hint = "the gateway's certificate is not trusted: register its CA with 'openshell gateway add NAME --endpoint URL --ca ca.crt', or use --gateway-insecure"
		case strings.HasPrefix(t.Endpoint, "https://") && t.CertFile == "" &&
			(strings.Contains(reason, "broken pipe") || strings.Contains(reason, "connection reset") || strings.Contains(reason, "EOF")):
			hint = "is openshell-gateway running? if it requires a client certificate, register one with 'openshell gateway add NAME --endpoint URL --ca ca.crt --cert tls.crt --key tls.key'"
		case strings.Contains(reason, "does not look like a TLS handshake"):
			hint = "the endpoint does not speak TLS: try http:// instead of https://"
		}
		out = fmt.Sprintf("cannot reach %s: %s (%s)", t.describe(), reason, hint)
	case codes.Unauthenticated:
		out = fmt.Sprintf("%s rejected the request as unauthenticated: %s\nhint: %s", t.describe(), msg, unauthenticatedHint(t))
	case codes.PermissionDenied:
		out = fmt.Sprintf("permission denied: %s\nhint: 'openshell whoami' shows your identity and roles", msg)
	case codes.NotFound:
		if what != "" {
			out = fmt.Sprintf("%s not found in workspace %q", what, a.wsDisplay())
		} else {
			out = fmt.Sprintf("not found: %s", msg)
		}
	case codes.AlreadyExists:
		if what != "" {
			out = fmt.Sprintf("%s already exists in workspace %q", what, a.wsDisplay())
		} else {
			out = fmt.Sprintf("already exists: %s", msg)
		}
	case codes.InvalidArgument:
		out = fmt.Sprintf("invalid request: %s", msg)
	case codes.FailedPrecondition:
		out = msg
		if what != "" && !strings.Contains(msg, what) {
			out = fmt.Sprintf("%s: %s", what, msg)
		}
	case codes.Aborted:
		out = fmt.Sprintf("conflict: %s (another change happened at the same time; try again)", msg)
	case codes.ResourceExhausted:
		out = fmt.Sprintf("limit reached: %s", msg)
	case codes.Unimplemented:
		out = fmt.Sprintf("%s does not support this operation: %s", t.describe(), msg)
	case codes.DeadlineExceeded:
		out = fmt.Sprintf("timed out waiting for %s: %s", t.describe(), msg)
	case codes.Canceled:
		return context.Canceled
	default:
		out = fmt.Sprintf("gateway error (%s): %s", st.Code(), msg)
	}
	return &userError{msg: out, cause: err}
}

// unauthenticatedHint says how to authenticate to t, given the credentials
// openshell sent.
func unauthenticatedHint(t gatewayTarget) string {
	switch {
	case t.BearerToken != "":
		return fmt.Sprintf("the gateway did not accept the OIDC access token of gateway %q: log in again with 'openshell gateway login %s'", t.Name, t.Name)
	case t.CertFile != "":
		return fmt.Sprintf("the client certificate %s was not accepted; check that it is signed by the gateway's CA and has not expired", t.CertFile)
	case strings.HasPrefix(t.Endpoint, "http://") || strings.HasPrefix(t.Endpoint, "unix://"):
		return "this gateway requires authentication: use its https:// endpoint with a client certificate ('openshell gateway add NAME --endpoint https://HOST:PORT --ca ca.crt --cert tls.crt --key tls.key'), or start it with allow_unauthenticated_users for local development"
	default:
		return "register the gateway with a client certificate: 'openshell gateway add NAME --endpoint https://HOST:PORT --ca ca.crt --cert tls.crt --key tls.key'"
	}
}

// dialReason shortens a gRPC transport error to its cause, e.g.
// "connection refused".
func dialReason(msg string) string {
	for _, r := range []string{"connection refused", "no such file or directory", "no route to host", "i/o timeout",
		"certificate signed by unknown authority", "certificate is not valid", "connection reset by peer",
		"first record does not look like a TLS handshake", "permission denied", "no such host",
		"certificate required", "bad certificate", "broken pipe"} {
		if strings.Contains(msg, r) {
			return r
		}
	}
	if i := strings.LastIndex(msg, ": "); i >= 0 && i+2 < len(msg) {
		return strings.Trim(msg[i+2:], `"`)
	}
	return msg
}
