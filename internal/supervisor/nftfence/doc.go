// Package nftfence confines the network of a sandbox's agent processes
// when they share a network namespace with the supervisor (a Kubernetes
// pod): an nftables table of its own, installed in one netlink batch,
// lets sockets of the agent's uid or gid send only to the egress proxy on
// loopback, and replies on loopback to connections made to the agent's
// own loopback listeners. Every other packet they send (TCP to anywhere
// else, UDP including DNS, ICMP, IPv6, raw) is rejected. Sockets of other
// owners, the supervisor's among them, are not matched: the supervisor
// dials upstream and reaches the gateway unhindered.
//
// The fence is the kernel's: it holds whatever the agent does inside its
// uid and gid, which it cannot change (no capabilities, no_new_privs).
// Installing needs CAP_NET_ADMIN in the network namespace and nf_tables
// with conntrack in the kernel; Install reports either missing. A table
// left behind by a supervisor that died is replaced atomically by the
// next Install; Remove deletes it. A Fence is safe for use by one
// goroutine at a time. See docs/security.md.
package nftfence
