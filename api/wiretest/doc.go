// Package wiretest holds the wire-compatibility test: it compares the compiled
// descriptors under api/ with the public OpenShell wire facts, one fact per
// line: testdata/openshell-v1-wire.tsv (openshell.v1 and the packages it
// uses) and testdata/openshell-interceptor-wire.tsv
// (openshell.gateway_interceptor.v1).
package wiretest
