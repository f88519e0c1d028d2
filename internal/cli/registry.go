package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/atomicfile"
)

// DefaultSystemGatewayDir is the read-only system gateway registry root.
const DefaultSystemGatewayDir = "/etc/openshell"

// registry is the client-side gateway registry: a writable user root
// ($XDG_CONFIG_HOME/openshell) and a read-only system root (/etc/openshell).
//
// Layout under each root:
//
//	active_gateway                      name of the selected gateway
//	gateways/<name>/metadata.json       gatewayMeta (OpenShell's format)
//	gateways/<name>/mtls/ca.crt         CA that signs the gateway's certificate
//	gateways/<name>/mtls/tls.crt|key    client certificate and key (mTLS)
type registry struct {
	userDir   string
	systemDir string
}

// gatewayMeta is metadata.json in OpenShell's format: the keys and their
// meaning are those of OpenShell's CLI and SDKs, so one registry serves both
// implementations. is_remote and gateway_port are always written (OpenShell's
// reader requires them); gateway_port is 0 for a gateway that was added, not
// started by the CLI. Insecure is openshell-go's own key: OpenShell's
// readers ignore it.
type gatewayMeta struct {
	Name             string `json:"name"`
	Endpoint         string `json:"gateway_endpoint"`
	IsRemote         bool   `json:"is_remote"`
	GatewayPort      uint16 `json:"gateway_port"`
	RemoteHost       string `json:"remote_host,omitempty"`
	ResolvedHost     string `json:"resolved_host,omitempty"`
	AuthMode         string `json:"auth_mode,omitempty"`
	EdgeTeamDomain   string `json:"edge_team_domain,omitempty"`
	EdgeAuthURL      string `json:"edge_auth_url,omitempty"`
	OIDCIssuer       string `json:"oidc_issuer,omitempty"`
	OIDCClientID     string `json:"oidc_client_id,omitempty"`
	OIDCAudience     string `json:"oidc_audience,omitempty"`
	OIDCScopes       string `json:"oidc_scopes,omitempty"`
	VMDriverStateDir string `json:"vm_driver_state_dir,omitempty"`
	Insecure         bool   `json:"insecure,omitempty"`
	// Workspace is this CLI's default workspace for the gateway (set by
	// 'openshell workspace use'). OpenShell's clients ignore the key: they
	// take the workspace from --workspace or OPENSHELL_WORKSPACE only.
	Workspace string `json:"workspace,omitempty"`
}

// Auth modes of metadata.json (OpenShell's values).
const (
	authModeMTLS          = "mtls"
	authModePlaintext     = "plaintext"
	authModeOIDC          = "oidc"
	authModeCloudflareJWT = "cloudflare_jwt"
)

// effectiveAuthMode is auth_mode with OpenShell's default: absent means mTLS,
// except for an http:// endpoint, which is plaintext.
func (m gatewayMeta) effectiveAuthMode() string {
	switch {
	case m.AuthMode != "":
		return m.AuthMode
	case strings.HasPrefix(m.Endpoint, "https://"):
		return authModeMTLS
	default:
		return authModePlaintext
	}
}

// legacyGatewayMeta is metadata.json as openshell-go wrote it before it
// adopted OpenShell's format.
type legacyGatewayMeta struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	Insecure bool   `json:"insecure"`
}

// parseGatewayMeta decodes metadata.json in OpenShell's format, or in
// openshell-go's earlier format (migrated reports true then). OpenShell's
// aliases cf_team_domain and cf_auth_url are accepted.
func parseGatewayMeta(b []byte) (m gatewayMeta, migrated bool, err error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return gatewayMeta{}, false, err
	}
	if _, ok := keys["gateway_endpoint"]; !ok {
		if _, legacy := keys["endpoint"]; legacy {
			var old legacyGatewayMeta
			if err := json.Unmarshal(b, &old); err != nil {
				return gatewayMeta{}, false, err
			}
			return newGatewayMeta(old.Name, old.Endpoint, old.Insecure), true, nil
		}
		return gatewayMeta{}, false, errors.New("missing gateway_endpoint")
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return gatewayMeta{}, false, err
	}
	for alias, dst := range map[string]*string{"cf_team_domain": &m.EdgeTeamDomain, "cf_auth_url": &m.EdgeAuthURL} {
		if raw, ok := keys[alias]; ok && *dst == "" {
			_ = json.Unmarshal(raw, dst)
		}
	}
	return m, false, nil
}

// newGatewayMeta is the metadata of a gateway registered with an endpoint:
// plaintext for http:// and unix://, mtls (OpenShell's TLS mode: the client
// certificate is used when present) for https://; remote unless the host is
// loopback or the endpoint a unix socket.
func newGatewayMeta(name, endpoint string, insecure bool) gatewayMeta {
	m := gatewayMeta{Name: name, Endpoint: endpoint, AuthMode: authModePlaintext, Insecure: insecure}
	if strings.HasPrefix(endpoint, "https://") {
		m.AuthMode = authModeMTLS
	}
	if u, err := url.Parse(endpoint); err == nil && u.Scheme != "unix" {
		m.IsRemote = !isLoopbackHost(u.Hostname())
	}
	return m
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func marshalGatewayMeta(m gatewayMeta) ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// gatewayEntry is a registered gateway as found on disk.
type gatewayEntry struct {
	gatewayMeta
	Dir    string // gateways/<name>
	System bool   // found under the system root
}

func (e gatewayEntry) file(name string) string {
	p := filepath.Join(e.Dir, "mtls", name)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// CAFile, CertFile and KeyFile return the paths of the stored TLS material,
// or "" when absent.
func (e gatewayEntry) CAFile() string   { return e.file("ca.crt") }
func (e gatewayEntry) CertFile() string { return e.file("tls.crt") }
func (e gatewayEntry) KeyFile() string  { return e.file("tls.key") }

// newRegistry builds the registry from the environment. A set but unusable
// OPENSHELL_SYSTEM_GATEWAY_DIR prints a warning to warn and falls back to
// /etc/openshell.
func (a *app) newRegistry() *registry {
	return newRegistryFromEnv(a.lookupEnv, a.stderr)
}

func newRegistryFromEnv(lookup func(string) (string, bool), warn io.Writer) *registry {
	sys := DefaultSystemGatewayDir
	if v, ok := lookup("OPENSHELL_SYSTEM_GATEWAY_DIR"); ok {
		if v == "" || !filepath.IsAbs(v) {
			_, _ = fmt.Fprintf(warn, "warning: ignoring OPENSHELL_SYSTEM_GATEWAY_DIR=%q: it must be a non-empty absolute path; using %s\n", v, DefaultSystemGatewayDir)
		} else {
			sys = filepath.Clean(v)
		}
	}
	return &registry{userDir: filepath.Join(configHome(lookup), "openshell"), systemDir: sys}
}

func configHome(lookup func(string) (string, bool)) string {
	if v, ok := lookup("XDG_CONFIG_HOME"); ok && filepath.IsAbs(v) {
		return v
	}
	return filepath.Join(homeDir(lookup), ".config")
}

func stateHome(lookup func(string) (string, bool)) string {
	if v, ok := lookup("XDG_STATE_HOME"); ok && filepath.IsAbs(v) {
		return v
	}
	return filepath.Join(homeDir(lookup), ".local", "state")
}

func homeDir(lookup func(string) (string, bool)) string {
	if v, ok := lookup("HOME"); ok && v != "" {
		return v
	}
	if h, err := os.UserHomeDir(); err == nil {
		return h
	}
	return "/"
}

var gatewayNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func validateGatewayName(name string) error {
	if !gatewayNameRE.MatchString(name) {
		return usagef("invalid gateway name %q: use letters, digits, '.', '_' or '-' (at most 63 characters)", name)
	}
	return nil
}

// validateEndpoint checks an endpoint URL: http://host:port, https://host:port
// or unix:///absolute/path.
func validateEndpoint(endpoint string) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, usagef("invalid endpoint %q: %v", endpoint, err)
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, usagef("invalid endpoint %q: missing host", endpoint)
		}
		if u.Path != "" && u.Path != "/" {
			return nil, usagef("invalid endpoint %q: a gRPC endpoint has no path", endpoint)
		}
	case "unix":
		if u.Host != "" || !filepath.IsAbs(u.Path) {
			return nil, usagef("invalid endpoint %q: want unix:///absolute/path", endpoint)
		}
	default:
		return nil, usagef("invalid endpoint %q: the scheme must be http://, https:// or unix://", endpoint)
	}
	return u, nil
}

func (r *registry) gatewaysDir(root string) string { return filepath.Join(root, "gateways") }

func (r *registry) load(root, name string, system bool) (gatewayEntry, error) {
	dir := filepath.Join(r.gatewaysDir(root), name)
	path := filepath.Join(dir, "metadata.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return gatewayEntry{}, err
	}
	m, migrated, err := parseGatewayMeta(b)
	if err != nil {
		return gatewayEntry{}, fmt.Errorf("gateway %q: corrupt %s: %w", name, path, err)
	}
	m.Name = name
	if migrated && !system {
		// Rewrite in OpenShell's format so OpenShell's clients can read it
		// too. The system root is read-only: migrate in memory only.
		nb, err := marshalGatewayMeta(m)
		if err != nil {
			return gatewayEntry{}, err
		}
		if err := atomicfile.Write(path, nb, 0o600); err != nil {
			return gatewayEntry{}, fmt.Errorf("gateway %q: migrate %s to OpenShell's format: %w", name, path, err)
		}
	}
	return gatewayEntry{gatewayMeta: m, Dir: dir, System: system}, nil
}

// Get returns the gateway called name; the user root shadows the system root.
func (r *registry) Get(name string) (gatewayEntry, error) {
	if err := validateGatewayName(name); err != nil {
		return gatewayEntry{}, err
	}
	e, err := r.load(r.userDir, name, false)
	if err == nil {
		return e, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return gatewayEntry{}, err
	}
	e, err = r.load(r.systemDir, name, true)
	if err == nil {
		return e, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return gatewayEntry{}, err
	}
	return gatewayEntry{}, &notRegisteredError{name: name}
}

type notRegisteredError struct{ name string }

func (e *notRegisteredError) Error() string {
	return fmt.Sprintf("gateway %q is not registered (see 'openshell gateway list')", e.name)
}

// List returns all registered gateways sorted by name.
func (r *registry) List() ([]gatewayEntry, error) {
	seen := map[string]bool{}
	var out []gatewayEntry
	for _, root := range []struct {
		dir    string
		system bool
	}{{r.userDir, false}, {r.systemDir, true}} {
		ents, err := os.ReadDir(r.gatewaysDir(root.dir))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || (root.system && errors.Is(err, fs.ErrPermission)) {
				continue
			}
			return nil, err
		}
		for _, de := range ents {
			if !de.IsDir() || seen[de.Name()] || !gatewayNameRE.MatchString(de.Name()) {
				continue
			}
			e, err := r.load(root.dir, de.Name(), root.system)
			if err != nil {
				continue // not a gateway directory
			}
			seen[de.Name()] = true
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Active returns the name in active_gateway (user root first, then system),
// or "" when none is selected.
func (r *registry) Active() string {
	for _, root := range []string{r.userDir, r.systemDir} {
		b, err := os.ReadFile(filepath.Join(root, "active_gateway"))
		if err == nil {
			if n := strings.TrimSpace(string(b)); n != "" {
				return n
			}
		}
	}
	return ""
}

// Select makes name the active gateway.
func (r *registry) Select(name string) error {
	if _, err := r.Get(name); err != nil {
		return err
	}
	if err := os.MkdirAll(r.userDir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(r.userDir, "active_gateway"), []byte(name+"\n"), 0o600)
}

// SetWorkspace stores ws as the default workspace of the user-registered
// gateway name ("" clears it). Entries under the system root are read-only.
func (r *registry) SetWorkspace(name, ws string) error {
	e, err := r.Get(name)
	if err != nil {
		return err
	}
	if e.System {
		return fmt.Errorf("gateway %q is registered system-wide (%s): its default workspace cannot be changed here; use --workspace or OPENSHELL_WORKSPACE", name, e.Dir)
	}
	e.Workspace = ws
	b, err := marshalGatewayMeta(e.gatewayMeta)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(e.Dir, "metadata.json"), b, 0o600)
}

// addOptions are the inputs of Add.
type addOptions struct {
	Name, Endpoint      string
	CA, Cert, Key       string // source files to copy
	Insecure            bool
	AllowShadowedSystem bool
	// OIDC registers an auth_mode "oidc" gateway (OpenShell's
	// --oidc-issuer, --oidc-client-id, --oidc-audience, --oidc-scopes).
	OIDCIssuer, OIDCClientID, OIDCAudience, OIDCScopes string
}

// Add registers a gateway in the user root. It writes into a temporary
// directory first, so a failed add leaves nothing behind.
func (r *registry) Add(o addOptions) (gatewayEntry, error) {
	if err := validateGatewayName(o.Name); err != nil {
		return gatewayEntry{}, err
	}
	if _, err := validateEndpoint(o.Endpoint); err != nil {
		return gatewayEntry{}, err
	}
	if (o.Cert == "") != (o.Key == "") {
		return gatewayEntry{}, usagef("--cert and --key go together")
	}
	if o.Insecure && (o.CA != "" || o.Cert != "") {
		return gatewayEntry{}, usagef("--insecure cannot be combined with --ca, --cert or --key")
	}
	if (o.CA != "" || o.Cert != "") && !strings.HasPrefix(o.Endpoint, "https://") {
		return gatewayEntry{}, usagef("--ca, --cert and --key need an https:// endpoint")
	}
	if o.OIDCIssuer == "" && (o.OIDCClientID != "" || o.OIDCAudience != "" || o.OIDCScopes != "") {
		return gatewayEntry{}, usagef("--oidc-client-id, --oidc-audience and --oidc-scopes need --oidc-issuer")
	}
	if o.OIDCIssuer != "" {
		if !strings.HasPrefix(o.Endpoint, "https://") {
			return gatewayEntry{}, usagef("--oidc-issuer needs an https:// endpoint: the access token is sent over TLS only")
		}
		if u, err := url.Parse(o.OIDCIssuer); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return gatewayEntry{}, usagef("invalid --oidc-issuer %q: want an http:// or https:// URL", o.OIDCIssuer)
		}
	}
	final := filepath.Join(r.gatewaysDir(r.userDir), o.Name)
	if _, err := os.Stat(final); err == nil {
		return gatewayEntry{}, fmt.Errorf("gateway %q is already registered; remove it first with 'openshell gateway remove %s'", o.Name, o.Name)
	}
	if err := os.MkdirAll(r.gatewaysDir(r.userDir), 0o700); err != nil {
		return gatewayEntry{}, err
	}
	_ = os.Chmod(r.userDir, 0o700)
	_ = os.Chmod(r.gatewaysDir(r.userDir), 0o700)
	tmp, err := os.MkdirTemp(r.gatewaysDir(r.userDir), "."+o.Name+".tmp-")
	if err != nil {
		return gatewayEntry{}, err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // no-op after the rename
	if err := os.Chmod(tmp, 0o700); err != nil {
		return gatewayEntry{}, err
	}
	files := []struct{ src, dst string }{{o.CA, "ca.crt"}, {o.Cert, "tls.crt"}, {o.Key, "tls.key"}}
	for _, f := range files {
		if f.src == "" {
			continue
		}
		b, err := os.ReadFile(f.src)
		if err != nil {
			return gatewayEntry{}, fmt.Errorf("read %s: %w", f.src, err)
		}
		if err := os.MkdirAll(filepath.Join(tmp, "mtls"), 0o700); err != nil {
			return gatewayEntry{}, err
		}
		if err := os.WriteFile(filepath.Join(tmp, "mtls", f.dst), b, 0o600); err != nil {
			return gatewayEntry{}, err
		}
	}
	m := newGatewayMeta(o.Name, o.Endpoint, o.Insecure)
	if o.OIDCIssuer != "" {
		m.AuthMode, m.OIDCIssuer, m.OIDCClientID, m.OIDCAudience, m.OIDCScopes = authModeOIDC, o.OIDCIssuer, o.OIDCClientID, o.OIDCAudience, o.OIDCScopes
		if m.OIDCClientID == "" {
			m.OIDCClientID = oidcDefaultClientID
		}
	}
	b, err := marshalGatewayMeta(m)
	if err != nil {
		return gatewayEntry{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "metadata.json"), b, 0o600); err != nil {
		return gatewayEntry{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return gatewayEntry{}, err
	}
	return gatewayEntry{gatewayMeta: m, Dir: final}, nil
}

// Remove deletes a user gateway. A gateway that exists only under the
// system root is refused.
func (r *registry) Remove(name string) error {
	e, err := r.Get(name)
	if err != nil {
		return err
	}
	if e.System {
		return fmt.Errorf("gateway %q is defined in the system configuration (%s) and cannot be removed by openshell; ask an administrator, or register a personal gateway under another name", name, e.Dir)
	}
	if err := os.RemoveAll(e.Dir); err != nil {
		return err
	}
	if b, err := os.ReadFile(filepath.Join(r.userDir, "active_gateway")); err == nil && strings.TrimSpace(string(b)) == name {
		if err := os.Remove(filepath.Join(r.userDir, "active_gateway")); err != nil {
			return err
		}
	}
	return nil
}

// oidcTokenBundle is gateways/<name>/oidc_token.json as OpenShell's CLI
// writes it after 'openshell gateway login' (always in the user root).
type oidcTokenBundle struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token,omitempty"`
	ExpiresAt    *int64 `json:"expires_at,omitempty"` // unix seconds
	Issuer       string `json:"issuer"`
	ClientID     string `json:"client_id"`
}

// oidcTokenPath is where OpenShell's CLI keeps a gateway's OIDC tokens.
func (r *registry) oidcTokenPath(name string) string {
	return filepath.Join(r.gatewaysDir(r.userDir), name, "oidc_token.json")
}

// loadOIDCToken reads a gateway's oidc_token.json; a missing file is
// fs.ErrNotExist.
func (r *registry) loadOIDCToken(name string) (oidcTokenBundle, error) {
	path := r.oidcTokenPath(name)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return oidcTokenBundle{}, err
		}
		return oidcTokenBundle{}, fmt.Errorf("gateway %q: read OIDC credentials: %w", name, err)
	}
	var tb oidcTokenBundle
	if err := json.Unmarshal(b, &tb); err != nil || tb.AccessToken == "" {
		return oidcTokenBundle{}, fmt.Errorf("gateway %q: %s holds no access_token; log in again with 'openshell gateway login %s'", name, path, name)
	}
	return tb, nil
}

// storeOIDCToken writes oidc_token.json (0600, replaced atomically) and
// clears the fresh-login marker, as OpenShell's store_oidc_token does.
func (r *registry) storeOIDCToken(name string, tb oidcTokenBundle) error {
	b, err := json.MarshalIndent(tb, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(r.oidcTokenPath(name)), 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(r.oidcTokenPath(name), b, 0o600); err != nil {
		return fmt.Errorf("gateway %q: store OIDC credentials: %w", name, err)
	}
	return r.clearOIDCPrompt(name)
}

// lockOIDCToken takes an exclusive lock (flock) on the gateway's
// oidc_token.lock, waiting for another openshell that holds it; the
// returned function releases it.
func (r *registry) lockOIDCToken(name string) (func(), error) {
	path := filepath.Join(r.gatewaysDir(r.userDir), name, "oidc_token.lock")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gateway %q: lock OIDC credentials: %w", name, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("gateway %q: lock OIDC credentials: %w", name, err)
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}

// removeOIDCToken deletes oidc_token.json; a missing file is no error.
func (r *registry) removeOIDCToken(name string) error {
	if err := os.Remove(r.oidcTokenPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gateway %q: remove OIDC credentials: %w", name, err)
	}
	return nil
}

// oidcPromptPath is OpenShell's marker that the next browser login asks
// the identity provider for a fresh login (written by 'gateway logout').
func (r *registry) oidcPromptPath(name string) string {
	return filepath.Join(r.gatewaysDir(r.userDir), name, "oidc_login_prompt_required")
}

func (r *registry) oidcPromptRequired(name string) bool { return fileExists(r.oidcPromptPath(name)) }

func (r *registry) requestOIDCPrompt(name string) error {
	if err := os.MkdirAll(filepath.Dir(r.oidcPromptPath(name)), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(r.oidcPromptPath(name), []byte("1\n"), 0o600)
}

func (r *registry) clearOIDCPrompt(name string) error {
	if err := os.Remove(r.oidcPromptPath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
