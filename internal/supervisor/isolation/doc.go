// Package isolation confines the processes the supervisor starts for the
// agent (the main process, exec and SSH sessions).
//
// Go cannot run code between fork and exec in the child, but Linux keeps
// every attribute of the confinement per thread and a child inherits the
// forking thread's: the capability bounding, inheritable and ambient sets,
// no_new_privs, the Landlock domain and the seccomp filter. So each
// Confinement has a domain thread (domainThread): a goroutine locked to
// its own OS thread that, the first time an agent process starts, builds
// the Landlock ruleset (scoped, from Landlock ABI 6, to signals and
// abstract unix sockets of its domain) and the seccomp filter while root,
// empties the bounding, inheritable and ambient sets, sets no_new_privs,
// enforces the ruleset and installs the filter, all on that thread alone,
// and checks the result. [Launch.Start] then forks every agent process
// from that thread; os/exec's child clears the supplementary groups,
// switches to the agent's gid and uid (never 0; as root, setuid clears the
// permitted and effective sets), changes to the working directory and
// execve's the program. Every agent process of a Confinement thus shares
// one Landlock domain, which the supervisor is not in.
//
// A confinement that cannot be applied fails every spawn with its reason;
// a command from [Confinement.Command] refuses cmd.Start (only
// Launch.Start runs it). The agent therefore never starts half-confined.
//
// What each layer enforces and what it does not is written down in
// docs/security.md.
package isolation
