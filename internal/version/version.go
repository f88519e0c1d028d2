// Package version reports the build version, set at link time with
//
//	-ldflags "-X github.com/openshell-go/openshell/internal/version.Version=v1.2.3"
//
// and "devel" otherwise.
package version

// Version is the release version of all three binaries.
var Version = "devel"
