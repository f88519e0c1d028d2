package providers

import (
	"fmt"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// Limits, as OpenShell's (server/grpc/mod.rs).
const (
	MaxNameLen            = 253
	MaxTypeLen            = 64
	MaxCredentialEntries  = 32
	MaxConfigEntries      = 64
	MaxMapKeyLen          = 256
	MaxMapValueLen        = 8192
	MaxProvidersInSandbox = 32
)

// validateStringMap checks sizes. Its errors name the field and lengths,
// never a value.
func validateStringMap(m map[string]string, maxEntries int, field string) error {
	if len(m) > maxEntries {
		return errdefs.InvalidArgument(fmt.Sprintf("%s exceeds maximum entries (%d > %d)", field, len(m), maxEntries))
	}
	for k, v := range m {
		if k == "" {
			return errdefs.InvalidArgument(fmt.Sprintf("%s key must not be empty", field))
		}
		if len(k) > MaxMapKeyLen {
			return errdefs.InvalidArgument(fmt.Sprintf("%s key exceeds maximum length (%d > %d)", field, len(k), MaxMapKeyLen))
		}
		if len(v) > MaxMapValueLen {
			return errdefs.InvalidArgument(fmt.Sprintf("%s value exceeds maximum length (%d > %d)", field, len(v), MaxMapValueLen))
		}
	}
	return nil
}

// validateMutable checks what an update may change: credentials, config
// and expiry times.
func validateMutable(p *datamodelv1.Provider) error {
	if err := validateStringMap(p.GetCredentials(), MaxCredentialEntries, "provider.credentials"); err != nil {
		return err
	}
	if err := validateStringMap(p.GetConfig(), MaxConfigEntries, "provider.config"); err != nil {
		return err
	}
	if n := len(p.GetCredentialExpiresAtMs()); n > MaxCredentialEntries {
		return errdefs.InvalidArgument(fmt.Sprintf("provider.credential_expires_at_ms exceeds maximum entries (%d > %d)", n, MaxCredentialEntries))
	}
	for k, v := range p.GetCredentialExpiresAtMs() {
		if len(k) > MaxMapKeyLen {
			return errdefs.InvalidArgument(fmt.Sprintf("provider.credential_expires_at_ms key exceeds maximum length (%d > %d)", len(k), MaxMapKeyLen))
		}
		if v < 0 {
			return errdefs.InvalidArgument("provider.credential_expires_at_ms value must be greater than or equal to 0")
		}
	}
	return nil
}

// validateNew checks a provider to be created in workspace: metadata, name,
// type, the fields only the gateway sets, and sizes.
func validateNew(p *datamodelv1.Provider, workspace string) error {
	name := p.GetMetadata().GetName()
	if name == "" {
		return errdefs.InvalidArgument("provider metadata.name cannot be empty")
	}
	if len(name) > MaxNameLen {
		return errdefs.InvalidArgument(fmt.Sprintf("provider.name exceeds maximum length (%d > %d)", len(name), MaxNameLen))
	}
	if err := store.ValidateLabels(p.GetMetadata().GetLabels()); err != nil {
		return err
	}
	if len(p.GetType()) > MaxTypeLen {
		return errdefs.InvalidArgument(fmt.Sprintf("provider.type exceeds maximum length (%d > %d)", len(p.GetType()), MaxTypeLen))
	}
	if len(p.GetCredentialHandles()) > 0 {
		return errdefs.InvalidArgument("provider.credential_handles is internal gateway state and cannot be supplied")
	}
	if pw := p.GetProfileWorkspace(); pw != "" && pw != workspace {
		return errdefs.InvalidArgument("profile_workspace must be empty (global) or match the provider workspace")
	}
	return validateMutable(p)
}
