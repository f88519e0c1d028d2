package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/version"
)

func healthName(s openshellv1.ServiceStatus) string {
	n := strings.TrimPrefix(s.String(), "SERVICE_STATUS_")
	if n == "" || n == "UNSPECIFIED" {
		return "Unknown"
	}
	return n[:1] + strings.ToLower(n[1:])
}

// gatewayStatus is what 'openshell status' found out: Health says whether
// the gateway answers, GetGatewayInfo whether it accepts our credentials.
type gatewayStatus struct {
	Gateway   string   `json:"gateway"`
	Endpoint  string   `json:"endpoint"`
	Status    string   `json:"status"` // connected
	Health    string   `json:"health,omitempty"`
	Version   string   `json:"version,omitempty"`
	Auth      string   `json:"auth"` // authenticated, authenticated_not_admin, not_authenticated, unknown
	AuthError string   `json:"auth_error,omitempty"`
	Hint      string   `json:"hint,omitempty"`
	Drivers   []string `json:"drivers,omitempty"`
}

// probeStatus combines Health and GetGatewayInfo. An unreachable gateway is
// an error; a gateway that answers but rejects the credentials is
// "connected, not authenticated" (OpenShell's Health needs no credentials,
// so a gateway that rejects even Health is also reachable).
func (a *app) probeStatus(ctx context.Context, c openshellv1.OpenShellClient) (gatewayStatus, error) {
	st := gatewayStatus{Gateway: a.target.Name, Endpoint: a.target.Endpoint, Status: "connected"}
	notAuthenticated := func(err error) gatewayStatus {
		st.Auth = "not_authenticated"
		st.AuthError = status.Convert(err).Message()
		st.Hint = unauthenticatedHint(*a.target)
		return st
	}
	h, err := c.Health(ctx, &openshellv1.HealthRequest{})
	switch {
	case status.Code(err) == codes.Unauthenticated:
		return notAuthenticated(err), nil
	case status.Code(err) == codes.Unavailable:
		alert, rejected := a.tlsCredentialsRejected(ctx, status.Convert(err).Message())
		if !rejected {
			return gatewayStatus{}, a.rpcError(err, "")
		}
		// The gateway answered the TLS handshake with an alert refusing
		// our client certificate (or its absence): reachable, not
		// authenticated.
		st = notAuthenticated(err)
		st.AuthError = "the TLS handshake was refused: " + alert
		st.Hint = "the gateway requires a client certificate it trusts: register it with 'openshell gateway add NAME --endpoint URL --ca ca.crt --cert tls.crt --key tls.key'"
		if a.target.CertFile != "" {
			st.Hint = unauthenticatedHint(*a.target)
		}
		return st, nil
	case err != nil:
		return gatewayStatus{}, a.rpcError(err, "")
	}
	st.Health, st.Version = healthName(h.GetStatus()), h.GetVersion()
	if a.credentialsProblem != "" {
		// Reachable, but the stored credentials could not be sent.
		st.Auth = "not_authenticated"
		st.AuthError = a.credentialsProblem
		st.Hint = fmt.Sprintf("log in with 'openshell gateway login %s'", a.target.Name)
		return st, nil
	}
	info, err := c.GetGatewayInfo(ctx, &openshellv1.GetGatewayInfoRequest{})
	switch status.Code(err) {
	case codes.OK:
		st.Auth = "authenticated"
		if info.GetGatewayVersion() != "" {
			st.Version = info.GetGatewayVersion()
		}
		for _, d := range info.GetComputeDrivers() {
			name := d.GetName()
			if v := d.GetCapabilities().GetDriverVersion(); v != "" {
				name += " " + v
			}
			st.Drivers = append(st.Drivers, name)
		}
	case codes.PermissionDenied:
		// Authenticated, but gateway details need the platform_admin role.
		st.Auth = "authenticated_not_admin"
	case codes.Unauthenticated:
		return notAuthenticated(err), nil
	case codes.Unimplemented:
		st.Auth = "unknown"
		st.AuthError = "the gateway does not serve GetGatewayInfo"
	default:
		return gatewayStatus{}, a.rpcError(err, "")
	}
	return st, nil
}

// tlsCredentialsRejected reports whether a dial error is the gateway's TLS
// alert refusing the client certificate (or its absence), as opposed to no
// answer or our refusal of the gateway's certificate. With TLS 1.3 the
// client learns of the refusal only after its side of the handshake, so gRPC
// often reports a broken pipe or reset instead: then one TLS connection is
// made and read from to receive the alert itself.
func (a *app) tlsCredentialsRejected(ctx context.Context, msg string) (string, bool) {
	if alert, ok := clientCertAlert(msg); ok {
		return alert, true
	}
	r := dialReason(msg)
	if r != "broken pipe" && r != "connection reset by peer" && !strings.HasSuffix(msg, "EOF") {
		return "", false
	}
	u, err := url.Parse(a.target.Endpoint)
	if err != nil || u.Scheme != "https" {
		return "", false
	}
	cfg, hostport, err := tlsConfigFor(*a.target, u)
	if err != nil {
		return "", false
	}
	cfg.NextProtos = []string{"h2"}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", hostport)
	if err != nil {
		return clientCertAlert(err.Error())
	}
	defer func() { _ = conn.Close() }()
	deadline, _ := ctx.Deadline()
	_ = conn.SetReadDeadline(deadline)
	if _, err = conn.Read(make([]byte, 1)); err == nil {
		return "", false
	}
	return clientCertAlert(err.Error())
}

// clientCertAlert finds, in a dial error, a TLS alert the gateway sent
// about our client certificate ("remote error: tls: certificate required").
func clientCertAlert(msg string) (string, bool) {
	const prefix = "remote error: tls: "
	i := strings.Index(msg, prefix)
	if i < 0 {
		return "", false
	}
	alert := msg[i+len(prefix):]
	if j := strings.IndexAny(alert, "\"\n"); j >= 0 {
		alert = alert[:j]
	}
	switch alert {
	case "certificate required", "bad certificate", "unknown certificate authority", "expired certificate",
		"revoked certificate", "unsupported certificate", "unknown certificate", "access denied":
		return alert, true
	}
	return "", false
}

func (a *app) newStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Check that the gateway answers and accepts your credentials; show its version and compute driver",
		Long: `Check the gateway with Health and GetGatewayInfo.

Status is Connected when the gateway answers. Auth then says whether it
accepts your credentials: authenticated; authenticated without the
platform_admin role (gateway details hidden); or not authenticated, with a
hint on how to authenticate (exit code 0: the gateway is reachable). An
unreachable gateway is an error (exit code 1).`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			a.probeWithoutCredentials = true
			c, err := a.gateway()
			if err != nil {
				return err
			}
			st, err := a.probeStatus(cmd.Context(), c)
			if err != nil {
				return err
			}
			if a.structured() {
				return a.printPlain(st)
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintf(tw, "Gateway:\t%s\n", orDash(st.Gateway))
			_, _ = fmt.Fprintf(tw, "Endpoint:\t%s\n", st.Endpoint)
			state := "Connected"
			switch st.Health {
			case "", healthName(openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY):
			case healthName(openshellv1.ServiceStatus_SERVICE_STATUS_DEGRADED):
				state = "Connected (" + st.Health + ": the gateway is up but its database or compute driver is not answering; its /readyz says which)"
			default:
				state = "Connected (" + st.Health + ")"
			}
			_, _ = fmt.Fprintf(tw, "Status:\t%s\n", state)
			_, _ = fmt.Fprintf(tw, "Version:\t%s\n", orDash(st.Version))
			if len(st.Drivers) > 0 {
				_, _ = fmt.Fprintf(tw, "Driver:\t%s\n", strings.Join(st.Drivers, ", "))
			}
			switch st.Auth {
			case "authenticated":
				_, _ = fmt.Fprintf(tw, "Auth:\tauthenticated\n")
			case "authenticated_not_admin":
				_, _ = fmt.Fprintf(tw, "Auth:\tauthenticated (gateway details need the platform_admin role)\n")
			case "not_authenticated":
				_, _ = fmt.Fprintf(tw, "Auth:\tnot authenticated: %s\n", st.AuthError)
			default:
				_, _ = fmt.Fprintf(tw, "Auth:\tunknown (%s)\n", st.AuthError)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if st.Hint != "" {
				_, _ = fmt.Fprintf(a.stdout, "hint: %s\n", st.Hint)
			}
			return nil
		},
	}
}

func (a *app) newWhoamiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the identity the gateway sees for you",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			u, err := c.GetCurrentUser(cmd.Context(), &openshellv1.GetCurrentUserRequest{})
			if err != nil {
				return a.rpcError(err, "")
			}
			if a.structured() {
				return a.printProto(u)
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintf(tw, "Subject:\t%s\n", u.GetSubject())
			if u.GetDisplayName() != "" {
				_, _ = fmt.Fprintf(tw, "Name:\t%s\n", u.GetDisplayName())
			}
			_, _ = fmt.Fprintf(tw, "Provider:\t%s\n", orDash(u.GetIdentityProvider()))
			_, _ = fmt.Fprintf(tw, "Roles:\t%s\n", orDash(strings.Join(u.GetRoles(), ", ")))
			if len(u.GetScopes()) > 0 {
				_, _ = fmt.Fprintf(tw, "Scopes:\t%s\n", strings.Join(u.GetScopes(), ", "))
			}
			return tw.Flush()
		},
	}
}

func (a *app) newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client and gateway versions",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			view := map[string]string{"client": version.Version}
			gw := ""
			c, err := a.gateway()
			if err == nil {
				var h *openshellv1.HealthResponse
				h, err = c.Health(cmd.Context(), &openshellv1.HealthRequest{})
				if err == nil {
					gw = h.GetVersion()
				} else {
					err = a.rpcError(err, "")
				}
			}
			if gw != "" {
				view["gateway"] = gw
			}
			if a.structured() {
				if perr := a.printPlain(view); perr != nil {
					return perr
				}
			} else {
				_, _ = fmt.Fprintf(a.stdout, "Client:  %s\n", version.Version)
				if gw != "" {
					_, _ = fmt.Fprintf(a.stdout, "Gateway: %s\n", gw)
				}
			}
			if err != nil {
				_, _ = fmt.Fprintf(a.stderr, "gateway version unavailable: %v\n", err)
			}
			return nil
		},
	}
}

func (a *app) newCompletionCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:       "completion bash|zsh|fish",
		Short:     "Print a shell completion script",
		Long:      "Print a shell completion script. For bash: source <(openshell completion bash)",
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args:      argsUsage(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(a.stdout, true)
			case "zsh":
				return root.GenZshCompletion(a.stdout)
			default:
				return root.GenFishCompletion(a.stdout, true)
			}
		},
	}
}
