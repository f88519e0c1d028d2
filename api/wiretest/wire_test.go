package wiretest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	_ "github.com/openshell-go/openshell/api/openshell/compute/v1"
	_ "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	_ "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	_ "github.com/openshell-go/openshell/api/openshell/inference/v1"
	optionsv1 "github.com/openshell-go/openshell/api/openshell/options/v1"
	_ "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	_ "github.com/openshell-go/openshell/api/openshell/v1"
)

// Our extensions: the only additions to upstream's wire contract.
var extensions = map[string]bool{
	"field openshell.v1.SandboxTemplate service_account_name": true,
	"rpc openshell.v1.OpenShell AdoptSandbox":                 true,
	"rpc openshell.compute.v1.ComputeDriver AdoptSandbox":     true,
	"message openshell.v1.AdoptSandboxRequest":                true,
	"message openshell.compute.v1.AdoptSandboxRequest":        true,
	"message openshell.compute.v1.AdoptSandboxResponse":       true,
	// ServiceAccount bootstrap through a separately served kubernetes driver.
	"rpc openshell.compute.v1.ComputeDriver AuthenticateBootstrapToken": true,
	"message openshell.compute.v1.AuthenticateBootstrapTokenRequest":    true,
	"message openshell.compute.v1.AuthenticateBootstrapTokenResponse":   true,
}

// factsPath prefers the shared reference checkout next to the repository
// and falls back to the copy in testdata. env, when set, overrides both.
func factsPath(name, env string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	shared := filepath.Join("..", "..", "..", "shared", "reference", name)
	if _, err := os.Stat(shared); err == nil {
		return shared
	}
	return filepath.Join("testdata", name)
}

// factFiles are the upstream fact files and how many RPCs each lists.
var factFiles = []struct {
	name, env string
	rpcs      int
}{
	{"openshell-v1-wire.tsv", "OPENSHELL_WIRE_TSV", 83},
	{"openshell-interceptor-wire.tsv", "OPENSHELL_INTERCEPTOR_WIRE_TSV", 3},
}

func TestWireCompatibility(t *testing.T) {
	upstream := map[string]bool{}
	for _, ff := range factFiles {
		checkFactFile(t, factsPath(ff.name, ff.env), ff.rpcs, upstream)
	}

	// Nothing beyond upstream and our declared extensions.
	var extra []string
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "openshell.") {
			return true
		}
		walkOurs(fd, func(key string) {
			if !upstream[key] && !extensions[key] && !inExtensionMessage(key) {
				extra = append(extra, key)
			}
		})
		return true
	})
	sort.Strings(extra)
	for _, e := range extra {
		t.Errorf("not upstream and not a declared extension: %s", e)
	}
}

// checkFactFile checks every fact of one file against our descriptors and
// adds each fact's key to upstream.
func checkFactFile(t *testing.T, path string, wantRPCs int, upstream map[string]bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("wire facts: %v", err)
		}
		t.Skipf("wire facts not present: %v", err)
	}
	defer f.Close()

	var counts = map[string][2]int{} // kind -> {matched, total}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		cols := strings.Split(text, "\t")
		key, err := checkFact(cols)
		upstream[key] = true
		c := counts[cols[0]]
		c[1]++
		if err != nil {
			t.Errorf("%s:%d: %v", filepath.Base(path), line, err)
		} else {
			c[0]++
		}
		counts[cols[0]] = c
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	base := filepath.Base(path)
	t.Logf("%s: %d/%d messages, %d/%d fields, %d/%d enum values, %d/%d reserved, %d/%d rpcs match", base,
		counts["message"][0], counts["message"][1], counts["field"][0], counts["field"][1],
		counts["enum"][0], counts["enum"][1],
		counts["reserved"][0]+counts["reserved_name"][0], counts["reserved"][1]+counts["reserved_name"][1],
		counts["rpc"][0], counts["rpc"][1])
	fmt.Printf("%s: %d/%d messages, %d/%d fields, %d/%d rpcs match\n", base,
		counts["message"][0], counts["message"][1], counts["field"][0], counts["field"][1], counts["rpc"][0], counts["rpc"][1])
	if counts["rpc"][1] != wantRPCs {
		t.Errorf("%s lists %d rpcs, want %d", base, counts["rpc"][1], wantRPCs)
	}
}

// inExtensionMessage reports whether key is a field of a message that is
// itself one of our extensions.
func inExtensionMessage(key string) bool {
	parts := strings.Fields(key)
	return len(parts) == 3 && parts[0] == "field" && extensions["message "+parts[1]]
}

func walkOurs(fd protoreflect.FileDescriptor, visit func(string)) {
	for i := 0; i < fd.Messages().Len(); i++ {
		md := fd.Messages().Get(i)
		visit("message " + string(md.FullName()))
		for j := 0; j < md.Fields().Len(); j++ {
			visit(fmt.Sprintf("field %s %s", md.FullName(), md.Fields().Get(j).Name()))
		}
	}
	for i := 0; i < fd.Enums().Len(); i++ {
		ed := fd.Enums().Get(i)
		for j := 0; j < ed.Values().Len(); j++ {
			visit(fmt.Sprintf("enum %s %s", ed.FullName(), ed.Values().Get(j).Name()))
		}
	}
	for i := 0; i < fd.Services().Len(); i++ {
		sd := fd.Services().Get(i)
		for j := 0; j < sd.Methods().Len(); j++ {
			visit(fmt.Sprintf("rpc %s %s", sd.FullName(), sd.Methods().Get(j).Name()))
		}
	}
}

func findMessage(name string) (protoreflect.MessageDescriptor, error) {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil, fmt.Errorf("message %s: missing", name)
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a message", name)
	}
	return md, nil
}

// checkFact verifies one upstream fact against our descriptors and returns
// the key under which walkOurs reports the same element.
func checkFact(c []string) (string, error) {
	switch c[0] {
	case "message":
		_, err := findMessage(c[1])
		return "message " + c[1], err
	case "field":
		key := fmt.Sprintf("field %s %s", c[1], c[2])
		md, err := findMessage(c[1])
		if err != nil {
			return key, err
		}
		fd := md.Fields().ByName(protoreflect.Name(c[2]))
		if fd == nil {
			return key, fmt.Errorf("%s.%s: missing", c[1], c[2])
		}
		if got := strconv.Itoa(int(fd.Number())); got != c[3] {
			return key, fmt.Errorf("%s.%s: number %s, want %s", c[1], c[2], got, c[3])
		}
		if got := typeName(fd); got != c[4] {
			return key, fmt.Errorf("%s.%s: type %s, want %s", c[1], c[2], got, c[4])
		}
		if got := label(fd); got != c[5] {
			return key, fmt.Errorf("%s.%s: label %s, want %s", c[1], c[2], got, c[5])
		}
		oneof := ""
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() {
			oneof = string(o.Name())
		}
		if want := col(c, 6); oneof != want {
			return key, fmt.Errorf("%s.%s: oneof %q, want %q", c[1], c[2], oneof, want)
		}
		if err := sameOptions(fd.Options(), col(c, 7)); err != nil {
			return key, fmt.Errorf("%s.%s: options: %w", c[1], c[2], err)
		}
		return key, nil
	case "reserved":
		key := "reserved " + c[1] + " " + c[2]
		md, err := findMessage(c[1])
		if err != nil {
			return key, err
		}
		from, to, _ := strings.Cut(c[2], "-")
		lo, _ := strconv.Atoi(from)
		hi, _ := strconv.Atoi(to)
		rr := md.ReservedRanges()
		for i := 0; i < rr.Len(); i++ {
			r := rr.Get(i)
			if int(r[0]) == lo && int(r[1]) == hi+1 {
				return key, nil
			}
		}
		return key, fmt.Errorf("%s: reserved range %s missing", c[1], c[2])
	case "reserved_name":
		key := "reserved_name " + c[1] + " " + c[2]
		md, err := findMessage(c[1])
		if err != nil {
			return key, err
		}
		if !md.ReservedNames().Has(protoreflect.Name(c[2])) {
			return key, fmt.Errorf("%s: reserved name %q missing", c[1], c[2])
		}
		return key, nil
	case "enum":
		key := fmt.Sprintf("enum %s %s", c[1], c[2])
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(c[1]))
		if err != nil {
			return key, fmt.Errorf("enum %s: missing", c[1])
		}
		ed, ok := d.(protoreflect.EnumDescriptor)
		if !ok {
			return key, fmt.Errorf("%s is not an enum", c[1])
		}
		v := ed.Values().ByName(protoreflect.Name(c[2]))
		if v == nil {
			return key, fmt.Errorf("%s.%s: missing", c[1], c[2])
		}
		if got := strconv.Itoa(int(v.Number())); got != c[3] {
			return key, fmt.Errorf("%s.%s: number %s, want %s", c[1], c[2], got, c[3])
		}
		return key, nil
	case "rpc":
		key := fmt.Sprintf("rpc %s %s", c[1], c[2])
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(c[1]))
		if err != nil {
			return key, fmt.Errorf("service %s: missing", c[1])
		}
		sd := d.(protoreflect.ServiceDescriptor)
		m := sd.Methods().ByName(protoreflect.Name(c[2]))
		if m == nil {
			return key, fmt.Errorf("rpc %s.%s: missing", c[1], c[2])
		}
		if string(m.Input().FullName()) != c[3] || string(m.Output().FullName()) != c[4] {
			return key, fmt.Errorf("rpc %s: %s -> %s, want %s -> %s", c[2], m.Input().FullName(), m.Output().FullName(), c[3], c[4])
		}
		if strconv.FormatBool(m.IsStreamingClient()) != c[5] || strconv.FormatBool(m.IsStreamingServer()) != c[6] {
			return key, fmt.Errorf("rpc %s: streaming client=%v server=%v, want %s %s", c[2], m.IsStreamingClient(), m.IsStreamingServer(), c[5], c[6])
		}
		if err := sameOptions(m.Options(), col(c, 7)); err != nil {
			return key, fmt.Errorf("rpc %s: options: %w", c[2], err)
		}
		return key, nil
	}
	return strings.Join(c, " "), fmt.Errorf("unknown fact kind %q", c[0])
}

func col(c []string, i int) string {
	if i < len(c) {
		return c[i]
	}
	return ""
}

func typeName(fd protoreflect.FieldDescriptor) string {
	if fd.IsMap() {
		return fmt.Sprintf("map<%s,%s>", typeName(fd.MapKey()), typeName(fd.MapValue()))
	}
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return string(fd.Message().FullName())
	case protoreflect.EnumKind:
		return string(fd.Enum().FullName())
	}
	return fd.Kind().String()
}

func label(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsList():
		return "repeated"
	case fd.HasOptionalKeyword():
		return "optional"
	}
	return "singular"
}

// sameOptions compares options (protojson form, as the facts file writes them)
// semantically, key order aside.
func sameOptions(opts proto.Message, want string) error {
	got := "{}"
	if opts != nil {
		b, err := protojson.MarshalOptions{Resolver: protoregistry.GlobalTypes}.Marshal(opts)
		if err != nil {
			return err
		}
		got = string(b)
	}
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		return err
	}
	if want == "" {
		want = "{}"
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		return err
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		return fmt.Errorf("got %s, want %s", gb, wb)
	}
	return nil
}

// Keep the options import used even if no test reads it directly: the
// extension types must be registered for protojson to print them.
var _ = optionsv1.E_Authorization
var _ = descriptorpb.MethodOptions{}
