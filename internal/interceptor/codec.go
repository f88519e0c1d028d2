package interceptor

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	optionsv1 "github.com/openshell-go/openshell/api/openshell/options/v1"
)

// isSecret reports whether fd carries the (openshell.options.v1.secret) option.
func isSecret(fd protoreflect.FieldDescriptor) bool {
	v, _ := proto.GetExtension(fd.Options(), optionsv1.E_Secret).(bool)
	return v
}

var secretCache sync.Map // protoreflect.FullName -> bool

// hasSecret reports whether a message of type md can hold a secret field,
// at any depth.
func hasSecret(md protoreflect.MessageDescriptor) bool {
	if v, ok := secretCache.Load(md.FullName()); ok {
		return v.(bool)
	}
	v := hasSecretWalk(md, map[protoreflect.FullName]bool{})
	secretCache.Store(md.FullName(), v)
	return v
}

func hasSecretWalk(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fs := md.Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		if isSecret(fd) {
			return true
		}
		if sub := valueMessage(fd); sub != nil && hasSecretWalk(sub, seen) {
			return true
		}
	}
	return false
}

// valueMessage is the message type of fd's values (map values, list
// elements or the field itself), or nil.
func valueMessage(fd protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if fd.IsMap() {
		return fd.MapValue().Message()
	}
	return fd.Message()
}

// clearSecrets removes every secret field from m, recursively.
func clearSecrets(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case isSecret(fd):
			m.Clear(fd)
		case valueMessage(fd) == nil || !hasSecret(valueMessage(fd)):
		case fd.IsMap():
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				clearSecrets(mv.Message())
				return true
			})
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				clearSecrets(l.Get(i).Message())
			}
		default:
			clearSecrets(v.Message())
		}
		return true
	})
}

// restoreSecrets copies every secret field of src into dst, recursively.
// The patch checks keep every object that holds a secret in place, so the
// two messages have the same shape wherever secrets live.
func restoreSecrets(dst, src protoreflect.Message) {
	fs := src.Descriptor().Fields()
	for i := range fs.Len() {
		fd := fs.Get(i)
		switch {
		case isSecret(fd):
			if src.Has(fd) {
				dst.Set(fd, src.Get(fd))
			} else {
				dst.Clear(fd)
			}
		case valueMessage(fd) == nil || !hasSecret(valueMessage(fd)) || !src.Has(fd) || !dst.Has(fd):
		case fd.IsMap():
			dm := dst.Mutable(fd).Map()
			src.Get(fd).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				if dm.Has(k) {
					restoreSecrets(dm.Mutable(k).Message(), v.Message())
				}
				return true
			})
		case fd.IsList():
			sl, dl := src.Get(fd).List(), dst.Mutable(fd).List()
			for j := range min(sl.Len(), dl.Len()) {
				restoreSecrets(dl.Get(j).Message(), sl.Get(j).Message())
			}
		default:
			restoreSecrets(dst.Mutable(fd).Message(), src.Get(fd).Message())
		}
	}
}

var marshalJSON = protojson.MarshalOptions{}

// operationJSON is m as ProtoJSON without its secret fields.
func operationJSON(m proto.Message) ([]byte, error) {
	if hasSecret(m.ProtoReflect().Descriptor()) {
		m = proto.Clone(m)
		clearSecrets(m.ProtoReflect())
	}
	return marshalJSON.Marshal(m)
}

// errSecretPath is returned for a patch that would read or write a secret.
var errSecretPath = errors.New("selects a secret field or an object containing one")

// checkPatchPath refuses a JSON Pointer (RFC 6901) into the request type md
// that selects a secret field, or an object, list or map that holds one.
func checkPatchPath(md protoreflect.MessageDescriptor, ptr string) error {
	if ptr != "" && !strings.HasPrefix(ptr, "/") {
		return fmt.Errorf("path %q is not a JSON pointer", ptr)
	}
	var toks []string
	if ptr != "" {
		toks = strings.Split(ptr[1:], "/")
	}
	// Where the pointer is: in a message, in a list or map of a field, or
	// past any secret (a scalar or a message type without secrets).
	cur := md
	var coll protoreflect.FieldDescriptor
	for _, t := range toks {
		t = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
		if coll != nil { // list index or map key
			cur, coll = valueMessage(coll), nil
			if cur == nil || !hasSecret(cur) {
				return nil
			}
			continue
		}
		if cur == nil || !hasSecret(cur) {
			return nil
		}
		fd := cur.Fields().ByJSONName(t)
		if fd == nil {
			fd = cur.Fields().ByTextName(t)
		}
		if fd == nil {
			return nil // not a field: the candidate will not decode
		}
		if isSecret(fd) {
			return fmt.Errorf("path %q %w", ptr, errSecretPath)
		}
		if fd.IsList() || fd.IsMap() {
			coll, cur = fd, nil
			continue
		}
		cur = fd.Message()
	}
	if coll != nil {
		if vm := valueMessage(coll); vm != nil && hasSecret(vm) {
			return fmt.Errorf("path %q %w", ptr, errSecretPath)
		}
		return nil
	}
	if cur != nil && hasSecret(cur) {
		return fmt.Errorf("path %q %w", ptr, errSecretPath)
	}
	return nil
}

type patchOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value,omitempty"`
	From  *string         `json:"from,omitempty"`
}

// applyPatches applies one binding's whole patch list to the operation op
// of the request cur. The result is a new request (secrets restored from
// cur) and its canonical operation; on error cur and op stay as they are.
func applyPatches(cur proto.Message, op []byte, patches []*gipb.JsonPatch) (proto.Message, []byte, error) {
	md := cur.ProtoReflect().Descriptor()
	ops := make([]patchOp, 0, len(patches))
	for i, p := range patches {
		po := patchOp{Op: p.GetOp(), Path: p.GetPath()}
		if err := checkPatchPath(md, p.GetPath()); err != nil {
			return nil, nil, fmt.Errorf("patch %d: %w", i, err)
		}
		switch p.GetOp() {
		case "move", "copy":
			from := p.GetFrom()
			if err := checkPatchPath(md, from); err != nil {
				return nil, nil, fmt.Errorf("patch %d: from: %w", i, err)
			}
			po.From = &from
		case "add", "replace", "test":
			if p.GetValue() == nil {
				return nil, nil, fmt.Errorf("patch %d: %s needs a value", i, p.GetOp())
			}
			v, err := protojson.Marshal(p.GetValue())
			if err != nil {
				return nil, nil, fmt.Errorf("patch %d: value: %w", i, err)
			}
			po.Value = v
		case "remove":
		default:
			return nil, nil, fmt.Errorf("patch %d: op %q is not an RFC 6902 operation", i, p.GetOp())
		}
		ops = append(ops, po)
	}
	doc, err := json.Marshal(ops)
	if err != nil {
		return nil, nil, err
	}
	patch, err := jsonpatch.DecodePatch(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("patch: %w", err)
	}
	candidate, err := patch.Apply(op)
	if err != nil {
		return nil, nil, fmt.Errorf("patch: %w", err)
	}
	next := cur.ProtoReflect().New().Interface()
	if err := protojson.Unmarshal(candidate, next); err != nil {
		return nil, nil, fmt.Errorf("patched operation is not a valid %s: %w", md.FullName(), err)
	}
	restoreSecrets(next.ProtoReflect(), cur.ProtoReflect())
	// Re-encode and decode back: the handler and later bindings see what
	// the wire format accepts.
	b, err := proto.Marshal(next)
	if err != nil {
		return nil, nil, fmt.Errorf("patched operation does not encode: %w", err)
	}
	decoded := cur.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(b, decoded); err != nil {
		return nil, nil, fmt.Errorf("patched operation does not decode: %w", err)
	}
	nextOp, err := operationJSON(decoded)
	if err != nil {
		return nil, nil, err
	}
	return decoded, nextOp, nil
}

// codeByName maps a gRPC code name ("PERMISSION_DENIED") to its number.
func codeByName(s string) (uint32, bool) {
	for c := uint32(1); c <= 16; c++ {
		if codeNames[c] == s {
			return c, true
		}
	}
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n <= 16 {
		return uint32(n), true
	}
	return 0, false
}

var codeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
	"OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
