package config

import (
	"maps"
	"slices"
)

// inheritedDriverKeys lists, per driver, the [openshell.gateway] keys copied
// into [openshell.drivers.<name>] when the driver table does not set them.
// Drivers not listed (remote drivers, unknown names) inherit nothing.
// image_pull_policy is never inherited.
var inheritedDriverKeys = map[string][]string{
	"kubernetes": {"sandbox_namespace", "default_image", "supervisor_image", "client_tls_secret_name", "service_account_name", "sa_token_ttl_secs", "enable_user_namespaces"},
	"docker":     {"default_image", "supervisor_image", "guest_tls_ca", "guest_tls_cert", "guest_tls_key", "host_gateway_ip"},
	"podman":     {"default_image", "supervisor_image", "guest_tls_ca", "guest_tls_cert", "guest_tls_key", "host_gateway_ip", "enable_user_namespaces"},
	"vm":         {"default_image", "guest_tls_ca", "guest_tls_cert", "guest_tls_key"},
	"process":    {"default_image"},
}

// InheritedDriverKeys returns the gateway-wide keys the named driver inherits.
func InheritedDriverKeys(driver string) []string {
	return slices.Clone(inheritedDriverKeys[driver])
}

// gatewayWide returns the inheritable keys set in [openshell.gateway].
func gatewayWide(g *fileGateway) map[string]any {
	out := map[string]any{}
	put := func(k string, v any, ok bool) {
		if ok {
			out[k] = v
		}
	}
	ps := func(k string, p *string) { put(k, deref(p), p != nil) }
	ps("sandbox_namespace", g.SandboxNamespace)
	ps("default_image", g.DefaultImage)
	ps("supervisor_image", g.SupervisorImage)
	ps("client_tls_secret_name", g.ClientTLSSecretName)
	ps("service_account_name", g.ServiceAccountName)
	ps("host_gateway_ip", g.HostGatewayIP)
	ps("guest_tls_ca", g.GuestTLSCA)
	ps("guest_tls_cert", g.GuestTLSCert)
	ps("guest_tls_key", g.GuestTLSKey)
	put("enable_user_namespaces", deref(g.EnableUserNamespaces), g.EnableUserNamespaces != nil)
	put("sa_token_ttl_secs", deref(g.SATokenTTLSecs), g.SATokenTTLSecs != nil)
	return out
}

// driverConfigs returns a copy of every [openshell.drivers.<name>] table plus
// an entry for each selected driver, with inheritance applied. A key set in
// the driver table wins over the inherited one.
func driverConfigs(file *fileRoot, selected []string) map[string]map[string]any {
	out := map[string]map[string]any{}
	var wide map[string]any
	if file != nil {
		for name, table := range file.OpenShell.Drivers {
			out[name] = maps.Clone(table)
		}
		wide = gatewayWide(&file.OpenShell.Gateway)
	}
	for _, name := range selected {
		if out[name] == nil {
			out[name] = map[string]any{}
		}
	}
	for name, table := range out {
		if table == nil {
			table = map[string]any{}
			out[name] = table
		}
		for _, k := range inheritedDriverKeys[name] {
			if _, set := table[k]; set {
				continue
			}
			if v, ok := wide[k]; ok {
				table[k] = v
			}
		}
	}
	return out
}
