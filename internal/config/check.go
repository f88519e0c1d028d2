package config

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// The checks below judge one value on its own. A flag's value is checked
// as the command line is parsed (a failure is a UsageError, exit 2); the
// same checks run again in resolve for values from the environment and the
// file (a failure there is an invalid configuration, exit 1).

func checkRange(n, lo, hi int) error {
	if n < lo || n > hi {
		return fmt.Errorf("%d is out of range %d-%d", n, lo, hi)
	}
	return nil
}

func checkNonNegative(n int) error {
	if n < 0 {
		return errors.New("must not be negative")
	}
	return nil
}

func checkIP(s string) error {
	if net.ParseIP(s) == nil {
		return fmt.Errorf("%q is not an IP address", s)
	}
	return nil
}

func checkLogLevel(s string) error {
	if _, ok := logLevels[strings.ToLower(strings.TrimSpace(s))]; !ok {
		return fmt.Errorf("%q is not one of trace, debug, info, warn, error", s)
	}
	return nil
}

func checkDatabaseURL(s string) error {
	for _, p := range []string{"sqlite:", "postgres://", "postgresql://"} {
		if strings.HasPrefix(s, p) {
			return nil
		}
	}
	return errors.New("unsupported scheme (want sqlite:<path> or postgres://...)")
}

func checkHTTPURL(s string) error {
	if s != "" && !strings.HasPrefix(s, "https://") && !strings.HasPrefix(s, "http://") {
		return fmt.Errorf("%q is not an http(s) URL", s)
	}
	return nil
}

// checkSecretRef checks the NAMESPACE/NAME form; the gateway validates the
// names themselves when it reads the Secret.
func checkSecretRef(s string) error {
	if s == "" {
		return nil
	}
	if ns, name, ok := strings.Cut(s, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%q is not NAMESPACE/NAME", s)
	}
	return nil
}

func checkSecurityEventSink(s string) error {
	if s == "" || s == "stdout" || strings.HasPrefix(s, "/") {
		return nil
	}
	return fmt.Errorf("%q is neither stdout nor an absolute file path", s)
}

// notImplemented are settings whose feature has not landed. They still
// parse, so that setting one stops the gateway with a message naming it
// instead of being ignored.
var notImplemented = []struct {
	key  string // TOML key, dotted
	flag string // the flag (and its variable), "" when the file is the only source
	what string
	set  func(f *fileRoot) bool // for file-only keys
}{
	{key: "openshell.gateway.server_sans", flag: "server-san", what: "extra server names for the gateway (generate-certs --server-san puts names in the certificate)"},
	{key: "openshell.gateway.oidc.jwks_ttl_secs", flag: "oidc-jwks-ttl", what: "a configurable OIDC key cache lifetime"},
	{key: "openshell.gateway.credential_drivers", what: "credential drivers", set: func(f *fileRoot) bool { return f.OpenShell.Gateway.CredentialDrivers != nil }},
	{key: "openshell.gateway.default_credential_driver", what: "credential drivers", set: func(f *fileRoot) bool { return f.OpenShell.Gateway.DefaultCredentialDriver != nil }},
	{key: "openshell.gateway.credential_storage", what: "credential drivers", set: func(f *fileRoot) bool { return f.OpenShell.Gateway.CredentialStorage != nil }},
	{key: "openshell.credential_drivers", what: "credential drivers", set: func(f *fileRoot) bool { return f.OpenShell.CredentialDrivers != nil }},
	{key: "openshell.supervisor", what: "supervisor middleware", set: func(f *fileRoot) bool { return f.OpenShell.Supervisor != nil }},
	{key: "openshell.gateway.policy_validation_failure_mode", what: "policy validation failure modes", set: func(f *fileRoot) bool { return f.OpenShell.Gateway.PolicyValidationFailureMode != nil }},
	{key: "openshell.gateway.tls.external_cert_path", what: "a second certificate chosen by SNI", set: func(f *fileRoot) bool { t := f.OpenShell.Gateway.TLS; return t != nil && t.ExternalCertPath != nil }},
	{key: "openshell.gateway.tls.external_key_path", what: "a second certificate chosen by SNI", set: func(f *fileRoot) bool { t := f.OpenShell.Gateway.TLS; return t != nil && t.ExternalKeyPath != nil }},
	{key: "openshell.gateway.tls.external_server_names", what: "a second certificate chosen by SNI", set: func(f *fileRoot) bool { t := f.OpenShell.Gateway.TLS; return t != nil && t.ExternalServerNames != nil }},
}

// refuseNotImplemented names every setting of notImplemented that is set,
// by where it was set: flag, environment variable or file key.
func (s *settings) refuseNotImplemented(file *fileRoot, path string) []error {
	var errs []error
	for _, n := range notImplemented {
		where := ""
		if n.flag != "" {
			switch s.source[n.flag] {
			case "flag":
				where = "--" + n.flag
			case "env":
				for _, sp := range specs {
					if sp.name == n.flag {
						where = sp.env
					}
				}
			case "file":
				where = fmt.Sprintf("config file %s: %s", path, n.key)
			}
		} else if file != nil && n.set(file) {
			where = fmt.Sprintf("config file %s: %s", path, n.key)
		}
		if where != "" {
			errs = append(errs, fmt.Errorf("%s: %s is not implemented in this gateway yet; remove the setting", where, n.what))
		}
	}
	return errs
}
