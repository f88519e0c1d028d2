// Package remote connects the gateway to a compute driver running in
// another process, over openshell.compute.v1.ComputeDriver on a Unix
// socket, and serves any in-process compute.Driver over the same contract.
//
// Dial returns a *Driver that implements compute.Driver (and
// compute.Adopter, answering Unimplemented when the remote driver cannot
// adopt) by proxying each call; Serve exposes a compute.Driver on a socket
// (mode 0600, removed on exit), which is what
// `openshell-gateway driver serve` runs. Errors cross the wire as gRPC
// status codes (errdefs.ToGRPC on the server, errdefs.FromGRPC on the
// client), so errdefs kinds and messages survive; errors of no known kind
// become Internal with a generic message, and the server logs them.
//
// The socket's file mode is the access control: only the gateway's user
// can connect, as for the upstream driver sockets.
package remote
