package egress

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/cache"
)

// policyRego is the connection decision (policy.rego), evaluated by the
// Open Policy Agent library.
//
//go:embed policy.rego
var policyRego string

// decisionQuery is the one query prepared per policy generation.
const decisionQuery = "data.openshell.egress.decision"

// engine is the prepared Rego decision of one policy generation: the
// module compiled and the generation's rules stored as the base document
// data.egress, once. eval is safe for concurrent use.
type engine struct {
	query rego.PreparedEvalQuery
	// globs is the generation's own cache of compiled glob patterns,
	// when it has more than sharedGlobs (nil: OPA's shared cache).
	globs cache.InterQueryValueCache
	// opts are the options of every evaluation (all but the input): set
	// once, they spare each evaluation what OPA otherwise does per call —
	// a goroutine watching the context for cancellation (the decision's
	// context is never cancelled), a store transaction with its lock (one
	// read transaction of the generation's store, which is never written,
	// serves every evaluation) and a metrics collection nobody reads.
	opts []rego.EvalOption

	// memo holds the verdicts of this generation by request: an
	// evaluation depends on nothing but the request and the generation's
	// data (no clock, no I/O, a store never written), so a repeated
	// request gets the same verdict without evaluating again. The first
	// evaluation after a pause costs 5 to 10 times a warm one (caches
	// cold: 0.4 to 0.9 ms against 60 to 80 µs on the shared machine),
	// which a lookup avoids for the connections an agent repeats.
	// Errors are not kept.
	mu        sync.Mutex
	memo      map[string]verdict
	memoBytes int
	evals     atomic.Int64 // evaluations run (tests)
}

// Bounds of engine.memo: a request whose key is longer is not kept, and
// the memo starts again empty when it would pass either bound, so a
// sandbox naming endless hosts costs evaluations, not memory.
const (
	maxMemoKey     = 4 << 10
	maxMemoEntries = 1024
	maxMemoBytes   = 1 << 20
)

// memoKey encodes r unambiguously (each field prefixed by its length).
func memoKey(r Request) string {
	n := len(r.Host) + len(r.Exe) + 32
	for _, a := range r.Ancestors {
		n += len(a) + 8
	}
	if n > maxMemoKey {
		return ""
	}
	b := make([]byte, 0, n)
	field := func(s string) {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	field(r.Host)
	b = strconv.AppendUint(b, uint64(r.Port), 10)
	b = append(b, ';')
	field(r.Exe)
	for _, a := range r.Ancestors {
		field(a)
	}
	return string(b)
}

// decide is eval through the memo.
func (e *engine) decide(r Request) (verdict, error) {
	key := memoKey(r)
	if key != "" {
		e.mu.Lock()
		v, ok := e.memo[key]
		e.mu.Unlock()
		if ok {
			return v, nil
		}
	}
	v, err := e.eval(r)
	if err != nil || key == "" {
		return v, err
	}
	e.mu.Lock()
	if e.memo == nil || len(e.memo) >= maxMemoEntries || e.memoBytes+len(key) > maxMemoBytes {
		e.memo, e.memoBytes = make(map[string]verdict), 0
	}
	e.memo[key] = v
	e.memoBytes += len(key)
	e.mu.Unlock()
	return v, nil
}

// sharedGlobs is how many glob patterns a generation may have before it
// gets a cache of compiled patterns of its own: OPA keeps them in one
// process-wide cache of 100, which a larger policy would thrash (every
// evaluation compiling patterns again). Below it the shared cache is
// cheaper (no per-lookup key conversion).
const sharedGlobs = 48

// newEngine compiles module (policyRego outside tests) against the rules
// of one generation.
func newEngine(module string, rules []rule) (*engine, error) {
	data, patterns := regoData(rules)
	store := inmem.NewFromASTObject(ast.NewObject(
		ast.Item(ast.InternedTerm("egress"), ast.NewTerm(data)),
	))
	q, err := rego.New(
		rego.Query(decisionQuery),
		rego.Module("policy.rego", module),
		rego.Store(store),
		rego.StrictBuiltinErrors(true),
	).PrepareForEval(context.Background())
	if err != nil {
		return nil, fmt.Errorf("policy engine: %w", err)
	}
	// A read transaction only reads the store (no state of its own), so
	// concurrent evaluations share it; it is never closed, as the store is
	// never written, and goes with the generation.
	txn, err := store.NewTransaction(context.Background())
	if err != nil {
		return nil, fmt.Errorf("policy engine: %w", err)
	}
	e := &engine{query: q, opts: []rego.EvalOption{
		rego.EvalGenerateJSON(keepAST),
		rego.EvalTransaction(txn),
		rego.EvalExternalCancel(topdown.NewCancel()),
		rego.EvalMetrics(metrics.NoOp()),
	}}
	if patterns > sharedGlobs {
		size := patterns + 16
		e.globs = cache.NewInterQueryValueCache(context.Background(), &cache.Config{
			InterQueryBuiltinValueCache: cache.InterQueryBuiltinValueCacheConfig{MaxNumEntries: &size},
		})
		e.opts = append(e.opts, rego.EvalInterQueryBuiltinValueCache(e.globs))
	}
	return e, nil
}

// regoData is data.egress (see policy.rego): the rules in Snapshot order
// with their binaries split into exact paths and patterns, and the
// endpoints the snapshot kept grouped by port, then by exact host, by host
// pattern under its tail (hostTail), or as any host ("*", "**", hostless
// with allowed_ips), as [rule index, endpoint index] pairs (indices of
// Snapshot.rules). It is a lookup form of the policy, not
// a decision: every match is Rego's. It
// also returns the number of glob patterns (host and binary) in it.
func regoData(rules []rule) (ast.Object, int) {
	type portIndex struct {
		exact   map[string][]*ast.Term
		globs   map[string]map[string][]*ast.Term // by tail, then pattern
		anyHost []*ast.Term
	}
	ports := map[uint32]*portIndex{}
	patterns := 0
	rulesOut := make([]*ast.Term, 0, len(rules))
	for i, r := range rules {
		for j, ep := range r.endpoints {
			at := ast.ArrayTerm(ast.InternedTerm(i), ast.InternedTerm(j))
			host := strings.ToLower(ep.host)
			for _, p := range ep.ports {
				x := ports[p]
				if x == nil {
					x = &portIndex{exact: map[string][]*ast.Term{}, globs: map[string]map[string][]*ast.Term{}}
					ports[p] = x
				}
				switch {
				case host == "" && len(ep.allowedIPs) > 0:
					x.anyHost = append(x.anyHost, at) // hostless: allowed_ips decide
				case host == "":
				case host == "*" || host == "**":
					x.anyHost = append(x.anyHost, at)
				case strings.Contains(host, "*"):
					g, t := globPattern(host), hostTail(host)
					if x.globs[t] == nil {
						x.globs[t] = map[string][]*ast.Term{}
					}
					if x.globs[t][g] == nil {
						patterns++
					}
					x.globs[t][g] = append(x.globs[t][g], at)
				default:
					x.exact[host] = append(x.exact[host], at)
				}
			}
		}
		exact := ast.NewSet()
		var globs []*ast.Term
		for _, b := range r.binaries {
			if strings.Contains(b, "*") {
				patterns++
				globs = append(globs, ast.StringTerm(globPattern(b)))
			} else {
				exact.Add(ast.StringTerm(b))
			}
		}
		rulesOut = append(rulesOut, ast.ObjectTerm(
			ast.Item(ast.InternedTerm("name"), ast.StringTerm(r.name)),
			ast.Item(ast.InternedTerm("exact_binaries"), ast.NewTerm(exact)),
			ast.Item(ast.InternedTerm("glob_binaries"), ast.ArrayTerm(globs...)),
		))
	}
	portsOut := ast.NewObject()
	for p, x := range ports {
		portsOut.Insert(ast.StringTerm(strconv.FormatUint(uint64(p), 10)), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("exact_hosts"), ast.NewTerm(termLists(x.exact))),
			ast.Item(ast.InternedTerm("glob_hosts"), ast.NewTerm(tailLists(x.globs))),
			ast.Item(ast.InternedTerm("any_host"), ast.ArrayTerm(x.anyHost...)),
		))
	}
	return ast.NewObject(
		ast.Item(ast.InternedTerm("rules"), ast.ArrayTerm(rulesOut...)),
		ast.Item(ast.InternedTerm("ports"), ast.NewTerm(portsOut)),
	), patterns
}

// termLists is m as an object of arrays.
func termLists(m map[string][]*ast.Term) ast.Object {
	obj := ast.NewObject()
	for k, ts := range m {
		obj.Insert(ast.StringTerm(k), ast.ArrayTerm(ts...))
	}
	return obj
}

// tailLists is m as an object of objects of arrays.
func tailLists(m map[string]map[string][]*ast.Term) ast.Object {
	obj := ast.NewObject()
	for k, ts := range m {
		obj.Insert(ast.StringTerm(k), ast.NewTerm(termLists(ts)))
	}
	return obj
}

// hostTail is the end of a host pattern after its last label containing
// '*', from the dot before the next label (".example.com" for
// "*.example.com" and "*.s3.*.example.com"), or "" when that label is the
// last ("api.*"). Every host the pattern matches ends with its tail, which
// is literal at the end of the pattern: policy.rego tries a pattern only on
// the hosts ending so (hostTails), instead of every pattern of the port on
// every host.
func hostTail(pattern string) string {
	i := strings.LastIndexByte(pattern, '*')
	j := strings.IndexByte(pattern[i:], '.')
	if j < 0 {
		return ""
	}
	return pattern[i+j:]
}

// hostTails is the input "tails" of a request for host: "" and the host's
// ends from each of its dots (".b.c" and ".c" for "a.b.c"), the host
// lower-cased and one trailing dot removed as policy.rego does. These are
// the keys of the host patterns that may match it (hostTail); which of
// them do is Rego's glob.match. A tail missing here only leaves patterns
// untried, which denies: it can never allow.
func hostTails(host string) *ast.Term {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	n := 1 + strings.Count(host, ".")
	ts := make([]*ast.Term, 1, n)
	ts[0] = ast.InternedEmptyString
	for i := 0; i < len(host); i++ {
		if host[i] == '.' {
			ts = append(ts, ast.StringTerm(host[i:]))
		}
	}
	return ast.ArrayTerm(ts...)
}

// globPattern escapes, in an entry containing '*', every glob meta
// character of OPA's glob.match but '*': policies know only "*" and "**"
// as wildcards, so "?", "[...]", "{a,b}" and "\" match themselves. An
// entry without '*' is compared exactly and left as written.
func globPattern(s string) string {
	if !strings.Contains(s, "*") || !strings.ContainsAny(s, `?[]{}\`) {
		return s
	}
	var b strings.Builder
	for _, c := range []byte(s) {
		if strings.IndexByte(`?[]{}\`, c) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// verdict is the engine's decision: allow with the first allowing rule and
// every [rule, endpoint] match of the allowing rules, or the denial reason.
type verdict struct {
	allow   bool
	rule    int
	matches [][2]int // ascending
	reason  string
}

var errNoDecision = errors.New("the policy engine returned no decision")

// keepAST returns results as AST terms: the decision is read without a
// round trip through JSON-like Go values.
func keepAST(t *ast.Term, _ *rego.EvalContext) (any, error) { return t, nil }

// The keys of the input object and of the decision.
var (
	keyHost    = ast.StringTerm("host")
	keyPort    = ast.StringTerm("port")
	keyExe     = ast.StringTerm("exe")
	keyPaths   = ast.StringTerm("paths")
	keyTails   = ast.StringTerm("tails")
	keyAllow   = ast.StringTerm("allow")
	keyReason  = ast.StringTerm("reason")
	keyRule    = ast.StringTerm("rule")
	keyMatches = ast.StringTerm("matches")
)

// eval decides r. Any error (evaluation error, undefined or malformed
// result) is returned, and the caller denies.
func (e *engine) eval(r Request) (verdict, error) {
	e.evals.Add(1)
	paths := ast.NewSet(ast.StringTerm(r.Exe))
	for _, a := range r.Ancestors {
		paths.Add(ast.StringTerm(a))
	}
	input := ast.NewObject(
		ast.Item(keyHost, ast.StringTerm(r.Host)),
		ast.Item(keyPort, ast.InternedTerm(int(r.Port))),
		ast.Item(keyExe, ast.StringTerm(r.Exe)),
		ast.Item(keyPaths, ast.NewTerm(paths)),
		ast.Item(keyTails, hostTails(r.Host)),
	)
	opts := make([]rego.EvalOption, 0, len(e.opts)+1)
	rs, err := e.query.Eval(context.Background(), append(append(opts, e.opts...), rego.EvalParsedInput(input))...)
	if err != nil {
		return verdict{}, err
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return verdict{}, errNoDecision
	}
	t, _ := rs[0].Expressions[0].Value.(*ast.Term)
	if t == nil {
		return verdict{}, errNoDecision
	}
	return parseVerdict(t.Value)
}

// parseVerdict reads the decision object; anything unexpected is an error.
func parseVerdict(v ast.Value) (verdict, error) {
	obj, ok := v.(ast.Object)
	if !ok {
		return verdict{}, fmt.Errorf("policy engine: decision is %s, want an object", ast.ValueName(v))
	}
	allow, ok := objGet[ast.Boolean](obj, keyAllow)
	if !ok {
		return verdict{}, errors.New("policy engine: decision without allow")
	}
	if !allow {
		reason, ok := objGet[ast.String](obj, keyReason)
		if !ok || reason == "" {
			return verdict{}, errors.New("policy engine: denial without a reason")
		}
		return verdict{reason: string(reason)}, nil
	}
	rule, ok := getInt(obj.Get(keyRule))
	set, ok2 := objGet[ast.Set](obj, keyMatches)
	if !ok || !ok2 || set.Len() == 0 {
		return verdict{}, errors.New("policy engine: allow without its rule and matches")
	}
	d := verdict{allow: true, rule: rule, matches: make([][2]int, 0, set.Len())}
	sorted := set.Sorted()
	for k := range sorted.Len() {
		a, ok := sorted.Elem(k).Value.(*ast.Array)
		if !ok || a.Len() != 2 {
			return verdict{}, errors.New("policy engine: malformed match")
		}
		i, ok1 := getInt(a.Elem(0))
		j, ok2 := getInt(a.Elem(1))
		if !ok1 || !ok2 {
			return verdict{}, errors.New("policy engine: malformed match")
		}
		d.matches = append(d.matches, [2]int{i, j})
	}
	return d, nil
}

func objGet[T ast.Value](obj ast.Object, key *ast.Term) (T, bool) {
	var zero T
	t := obj.Get(key)
	if t == nil {
		return zero, false
	}
	v, ok := t.Value.(T)
	return v, ok
}

func getInt(t *ast.Term) (int, bool) {
	if t == nil {
		return 0, false
	}
	n, ok := t.Value.(ast.Number)
	if !ok {
		return 0, false
	}
	i, ok := n.Int()
	return i, ok
}
