// Package config resolves the openshell-gateway configuration.
//
// Every setting comes from, in increasing precedence: a built-in default, the
// TOML file ([openshell.gateway] and friends), an OPENSHELL_* environment
// variable, and a command-line flag. Load reads all four once, applies the
// local TLS/JWT auto-discovery, validates the result and returns a plain
// *Config that callers pass down; there is no global configuration.
//
// The TOML file is decoded strictly: an unknown key is an error naming the key
// and its line. Driver tables ([openshell.drivers.<name>]) are kept raw and
// handed to the driver after inheriting the gateway-wide keys allowed for that
// driver (see InheritedDriverKeys). Keys whose feature has not landed
// (notImplemented) still decode, so that setting one is refused with a
// message naming it rather than ignored.
//
// A flag value the setting cannot take on its own is a UsageError (exit
// status 2); every other failure, environment and file values included, is
// an invalid configuration (exit status 1).
//
// Load is safe to call concurrently; a *Config is read-only after Load.
package config
