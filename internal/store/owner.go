package store

// scopeOwners maps each record type whose scope is the id of an object to
// that object's type. Records of these types belong to their owner: they
// can only be created while the owner exists, and they are deleted in the
// same transaction as the owner.
var scopeOwners = map[string]string{
	TypeSandboxPolicy:    TypeSandbox,
	TypeSandboxSettings:  TypeSandbox,
	TypeDraftPolicyChunk: TypeSandbox,
	TypeServiceEndpoint:  TypeSandbox,
}

// ScopeOwner reports the object type whose id is the scope of records of
// recordType, and false for record types whose scope names no object.
func ScopeOwner(recordType string) (ownerType string, ok bool) {
	ownerType, ok = scopeOwners[recordType]
	return ownerType, ok
}

// OwnedRecordTypes returns the record types scoped by objects of
// ownerType, in a stable order; nil when none are.
func OwnedRecordTypes(ownerType string) []string {
	var out []string
	for _, rt := range []string{TypeSandboxPolicy, TypeSandboxSettings, TypeDraftPolicyChunk, TypeServiceEndpoint} {
		if scopeOwners[rt] == ownerType {
			out = append(out, rt)
		}
	}
	return out
}
