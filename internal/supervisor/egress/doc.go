// Package egress is the sandbox's egress proxy: the only way out of a
// sandbox whose network namespace has nothing but loopback.
//
// Agent processes reach it through HTTP_PROXY/HTTPS_PROXY/ALL_PROXY on a
// loopback address inside the sandbox's network namespace. For each client
// connection (an HTTP CONNECT or one absolute-form http:// request) the
// proxy
//
//  1. identifies the processes holding the client socket (identify_linux.go:
//     the TCP tuple to the socket inode through /proc/net/tcp{,6}, the inode
//     to pids through /proc/*/fd, then /proc/<pid>/exe and the parents'
//     executables; a binary's content is hashed on first use and a later
//     different content at the same path is denied);
//  2. decides against one immutable Snapshot of network_policies (host
//     exact or wildcard, port, binaries; the first matching rule by name);
//  3. resolves the host once, refuses loopback, link-local, private and
//     reserved addresses, cloud metadata names and the gateway's own
//     addresses unless the matching endpoint's allowed_ips names them, and
//     dials only the checked addresses (no DNS rebinding between check and
//     dial);
//  4. reports the decision as an Event and counts denials in Denials.
//
// Dialing happens outside the sandbox's network namespace through the
// Config.Dial function; the supervisor uses package hostdial for it.
package egress
