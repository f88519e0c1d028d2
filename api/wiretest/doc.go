// Package wiretest holds the wire-compatibility test: it compares the compiled
// descriptors under api/ with the public OpenShell v1 wire facts
// (testdata/openshell-v1-wire.tsv, one fact per line).
package wiretest
