// Package isolation confines the processes the supervisor starts for the
// agent (the main process, exec and SSH sessions).
//
// Go cannot run code between fork and exec, so every agent process is
// started through a trampoline: the supervisor re-executes its own binary
// (/proc/self/exe) with argv[0] set to [TrampolineArg0]; the init function
// of the trampoline subpackage (imported by this one) recognises that name
// and never returns to the program's main. [Launch.Start] forks it from
// the Confinement's domain thread: one locked OS thread of the supervisor
// restricted, alone, by the Confinement's Landlock ruleset (scoped, from
// Landlock ABI 6, to signals and abstract unix sockets of that domain), so
// every agent process of a Confinement shares one Landlock domain that
// the supervisor is not in. The trampoline reads a JSON [Spec] from fd 3
// and, on one locked OS thread, while still root:
//
//  1. marks every descriptor above stderr close-on-exec,
//  2. clears the ambient capabilities (all threads) and drops every
//     capability from the bounding set of the locked thread, the one that
//     execve's (execve ends every other thread),
//  3. clears the supplementary groups and switches to the spec's gid and
//     uid (never 0), then clears the remaining capability sets and checks
//     that every set, including the bounding set, is empty,
//  4. sets no_new_privs (all threads), keeping the Landlock domain it was
//     forked in,
//  5. changes to the working directory and resolves the program as the
//     agent user,
//  6. installs the seccomp filter with SECCOMP_FILTER_FLAG_TSYNC,
//  7. execve's the agent.
//
// Any failure ends the trampoline before the agent runs: the error text is
// written to fd 4 (close-on-exec, so a successful execve closes it with
// nothing written) and the trampoline exits 127. [Launch.Started] turns
// that text into the error of the spawn. The agent therefore never starts
// half-confined.
//
// What each layer enforces and what it does not is written down in
// docs/security.md.
package isolation
