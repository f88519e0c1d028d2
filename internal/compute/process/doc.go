// Package process is the compute driver that runs each sandbox as a local
// openshell-sandbox supervisor process on Linux, with no container runtime.
//
// # Isolation
//
// The supervisor is started in new pid, mount, uts and ipc namespaces
// (clone flags), in its own process group. The new mount namespace
// inherits the host's propagation, so the supervisor must make /
// recursively private before it mounts anything (see the contract
// below). When the gateway does not run as root it also gets a new user
// namespace mapping the gateway's uid/gid to root. Resource requests
// and limits are enforced with cgroup v2 (<cgroup_root>/openshell/<id>,
// cpu.max, cpu.weight, memory.max, memory.low); the process is cloned
// directly into its cgroup. A request the host cannot enforce is rejected
// with FailedPrecondition at ValidateCreate, never ignored; so are GPUs,
// and a runtime_class_name (a Kubernetes setting) is InvalidArgument.
//
// # State
//
// Per sandbox, under <state_dir>/sandboxes/<id>/ (mode 0700):
//
//	state.json      the record: spec without token, instance id, pid, process start time, stopped flag
//	token           the sandbox JWT (0600); never on a command line or in logs
//	workspace/      the persistent workspace, kept across stop/start, removed on delete
//	supervisor.log  the supervisor's stdout and stderr
//
// On New the driver re-discovers running supervisors: a recorded pid is
// taken over only when the process is alive with the recorded start time
// (/proc/<pid>/stat field 22); otherwise the sandbox is reported as exited.
// A supervisor started just before a gateway crash, before its pid was
// recorded, is found by its OPENSHELL_INSTANCE_ID environment variable.
// A directory without state.json whose workspace is empty or absent is
// what a create interrupted before recording its state leaves, and is
// removed. Any other directory whose state cannot be loaded (state.json
// unreadable, corrupt or naming another id, or missing while the workspace
// holds files) is never touched: the error is logged and the sandbox is
// reported with Ready=False/Error naming the directory; Stop and Start
// refuse it, Create with its id fails with AlreadyExists, and only Delete
// removes it.
// Close stops watching and joins the driver's goroutines; it never stops
// sandboxes (the gateway decides that).
//
// # Supervisor contract
//
// The driver starts the supervisor with no arguments, its working
// directory the workspace, stdin /dev/null, and this environment (template
// environment, then spec environment, then the variables below, which
// cannot be overridden; nothing else leaks from the gateway's environment
// except a default PATH and HOME when the sandbox sets none):
//
//	OPENSHELL_SANDBOX_ID          sandbox id
//	OPENSHELL_SANDBOX_NAME        sandbox name
//	OPENSHELL_ENDPOINT            gateway callback endpoint ("unix:///path" or "http://127.0.0.1:17670")
//	OPENSHELL_SANDBOX_TOKEN_FILE  path of the 0600 file holding the sandbox JWT (unset when no token)
//	OPENSHELL_SANDBOX_COMMAND     JSON array: the main process argv (empty array: supervisor default)
//	OPENSHELL_SANDBOX_TTY         "true" or "false"
//	OPENSHELL_LOG_LEVEL           log level from the spec (may be empty)
//	OPENSHELL_WORKSPACE_DIR       host path of the persistent workspace
//	OPENSHELL_INSTANCE_ID         id of this incarnation (new on every start)
//
// and, because Go cannot run code between clone and exec, these requests
// that the supervisor performs at start, as pid 1 of its namespaces and
// before it dials the gateway (internal/supervisor implements them in
// setupNamespaces):
//
//	OPENSHELL_PRIVATE_TMP         "true" (always): first make / recursively private
//	                              (mount(NULL, "/", NULL, MS_REC|MS_PRIVATE)), so nothing
//	                              the sandbox mounts reaches the host; then, without
//	                              OPENSHELL_ROOTFS, isolate the host filesystem (below)
//	OPENSHELL_SANDBOX_HOSTNAME    sethostname(2) to the sandbox name (its own uts namespace)
//	OPENSHELL_ROOTFS              set only for a local rootfs image: pivot into it (below)
//
// Host filesystem (empty image): a fresh tmpfs on /tmp; the system
// directories /usr, /bin, /sbin, /lib, /lib32, /lib64, /libx32, /etc and
// /opt are resolved through symlinks (usrmerge: /bin -> usr/bin is covered
// by /usr), bound recursively onto themselves and every mount under them
// is remounted read-only, repeating its nosuid/nodev/noexec/atime flags
// (locked in a user namespace); the workspace stays writable even inside
// one of them; a fresh /proc for the pid namespace (kept as the host's
// /proc only where the kernel refuses the mount with EPERM).
//
// Root filesystem (image "dir:/path" or "/path"): the image is bound
// recursively onto itself; the workspace is bound at <rootfs>/sandbox; a
// fresh proc at <rootfs>/proc (a failure is fatal: the host's /proc would
// lead out of the image); a tmpfs /dev holding bind mounts of the host's
// null, zero, full, random, urandom and tty, a new devpts instance
// (ptmx -> pts/ptmx), /dev/shm and the fd symlinks (device nodes cannot be
// created in a user namespace, bind mounts of them can); a fresh tmpfs on
// <rootfs>/tmp; the directory of a unix:// gateway socket bound read-only
// at /dev/.openshell-gateway. Then pivot_root(".", ".") and a lazy
// unmount of the old root (no .oldroot directory, so one image directory
// can serve several sandboxes at once), the image's own system directories
// read-only as above, chdir /sandbox, OPENSHELL_WORKSPACE_DIR=/sandbox.
// Missing mount points (sandbox, proc, dev, tmp) are created in the image
// directory; existing ones must be real directories, not symlinks. The
// supervisor keeps running from its already-open binary and has read its
// token file before; the main process and SSH sessions run the image's
// /bin/sh (/bin/bash when present). Any failed step makes the supervisor
// exit non-zero with the step and path in supervisor.log, so the sandbox
// goes to ERROR.
//
// What this protects: system directories against writes (accidental or by
// an unprivileged process), the host's /tmp, the host's process list, and
// in a rootfs sandbox everything outside the image, the workspace and the
// gateway socket directory. What it does not: writable host paths outside
// the list (/root, /home, /var, /srv, /mnt, the gateway state directory
// other than through the workspace) in host-filesystem sandboxes; the rest
// of the image directory, which is shared with the host and with other
// sandboxes using it; /sys and the network, which are the host's. The
// sandbox's processes run as root of their namespaces with full
// capabilities there, so one that means to can remount the read-only
// directories writable again; and where the gateway runs as root (no user
// namespace) that root is the host's, able to create device nodes and
// mount host disks. These layers guard against mistakes and unprivileged
// code, not against a hostile root in the sandbox.
//
// OPENSHELL_SANDBOX_TOKEN, OPENSHELL_SANDBOX_TOKEN_FILE and OPENSHELL_ROOTFS
// from the spec or template environment are dropped: only the driver sets
// them, and the token itself never travels in the environment.
//
// The supervisor exits on SIGTERM; Stop and Delete send SIGTERM to the
// process group, then SIGKILL after stop_grace_secs or as soon as the
// call's context ends, and wait for the exit at most until the context
// ends (and never more than 10 s after SIGKILL). Because the supervisor is
// pid 1 of its pid namespace, it must install a SIGTERM handler or it only
// dies at SIGKILL.
//
// # Configuration
//
// Keys of [openshell.drivers.process]: supervisor_path (default:
// openshell-sandbox next to the gateway executable, else $PATH),
// cgroup_root (default: the cgroup2 mount), stop_grace_secs (default 10).
//
// # Conditions
//
// Running: Ready=True/Running. Stopped: Ready=False/Stopped and
// Suspended=True/Stopped. Exited on its own: Ready=False/ProcessExited with
// the exit code or signal in the message, plus a platform event.
package process
