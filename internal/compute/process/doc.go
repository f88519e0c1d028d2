// Package process is the compute driver that runs each sandbox as a local
// openshell-sandbox supervisor process on Linux, with no container runtime.
//
// # Isolation
//
// The supervisor is started in new pid, mount, uts, ipc and network
// namespaces (clone flags), in its own process group. The network
// namespace has nothing but its loopback interface: no egress at all (the
// egress proxy path does not exist yet), and the supervisor reaches the
// gateway through its own socket, which the driver forwards to the
// gateway's unix callback socket (below), which is why the driver refuses
// any other callback endpoint. The new mount namespace
// inherits the host's propagation, so the supervisor must make /
// recursively private before it mounts anything (see the contract
// below).
//
// User namespace. Where the gateway runs as root, every sandbox also gets
// a new user namespace mapping its ids 0..65535 to a host id range of its
// own (2^30 + n*65536, the lowest range no other sandbox
// holds, recorded in state.json as host_id_base and kept across
// stop/start), and the supervisor starts as the namespace's root: on the
// host it is that unprivileged id, not root, and so is anything that
// escapes the sandbox's other layers. Its workspace is owned by the range's
// root (a workspace of another owner, as earlier versions left it, is
// converted once). A dir: image reaches the sandbox as an id-mapped mount
// (below), so its files owned by host ids 0..65535 are the sandbox's ids
// 0..65535 inside; a kernel or filesystem without id-mapped mounts fails
// the create (FailedPrecondition), never falls back to host root. Where
// the gateway does not run as root, every
// sandbox gets a user namespace mapping the gateway's uid/gid to root
// (size 1). Resource requests
// and limits are enforced with cgroup v2 (<cgroup_root>/openshell/<id>,
// cpu.max, cpu.weight, memory.max, memory.low); the process is cloned
// directly into its cgroup. A request the host cannot enforce is rejected
// with FailedPrecondition at ValidateCreate, never ignored; so are GPUs,
// and a runtime_class_name or annotations (Kubernetes settings) and a
// user_namespaces request the driver cannot honour are InvalidArgument.
//
// # State
//
// Per sandbox, under <state_dir>/sandboxes/<id>/ (mode 0700):
//
//	state.json      the record: spec without token, instance id, pid, process start time, stopped flag
//	token           the sandbox JWT (0600, the gateway's user); never on a command line or in logs
//	gateway/        user namespace only: gateway.sock, this sandbox's own socket to the gateway (below)
//	workspace/      the persistent workspace (/sandbox inside), kept across stop/start, removed on delete
//	rootfs-layer/   a dir: image's writable layer (upper/ and work/, or copy/), kept across stop/start
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
// cannot be overridden; nothing else leaks from the gateway's environment;
// PATH defaults to the usual system directories and HOME to /sandbox):
//
//	OPENSHELL_SANDBOX_ID          sandbox id
//	OPENSHELL_SANDBOX_NAME        sandbox name
//	OPENSHELL_ENDPOINT            gateway callback endpoint ("unix:///path"; nothing else reaches a sandbox)
//	OPENSHELL_SANDBOX_TOKEN_FILE  path of the 0600 file holding the sandbox JWT (unset when no token)
//	OPENSHELL_SANDBOX_COMMAND     JSON array: the main process argv (empty array: supervisor default)
//	OPENSHELL_SANDBOX_TTY         "true" or "false"
//	OPENSHELL_LOG_LEVEL           log level from the spec (may be empty)
//	OPENSHELL_WORKSPACE_DIR       host path of the persistent workspace (bound at /sandbox)
//	OPENSHELL_INSTANCE_ID         id of this incarnation (new on every start)
//	OPENSHELL_EGRESS_DIALER_FD    "3": the supervisor's end of the driver's host dialer
//	                              (internal/supervisor/egress/hostdial), a SOCK_SEQPACKET
//	                              socket on which the driver opens TCP connections in the
//	                              host's network namespace for the egress proxy
//	OPENSHELL_EGRESS_DIALER_SOCKET set with the per-sandbox gateway socket (below):
//	                              "egress-dialer.sock", the host dialer's socket in the
//	                              directory of OPENSHELL_ENDPOINT, where the supervisor
//	                              reconnects when fd 3's channel ended with an earlier
//	                              gateway process
//	OPENSHELL_OTLP_ENDPOINT, OPENSHELL_OTLP_SERVICE_NAME, OPENSHELL_OTEL_*
//	                              only when the gateway has [openshell.gateway.otlp]: its
//	                              OTLP settings for the supervisor's own spans
//	                              (internal/telemetry.SupervisorEnv; the supervisor dials the
//	                              collector through the host dialer); a spec cannot set them
//	OPENSHELL_EGRESS_TEST_HOSTS   test only, copied from the gateway's own environment
//	                              (never from a sandbox spec): the proxy's resolver override
//	OPENSHELL_EGRESS_TEST_CA_FILE test only, copied likewise: CAs the proxy trusts for
//	                              upstreams of terminated TLS besides the system roots
//
// In a user namespace with its own range the supervisor's host ids cannot
// search the gateway's state directory, so the driver hands it what it
// needs as inherited fds named /proc/self/fd/N instead of paths (after the
// egress dialer's fd 3): it executes the supervisor binary through fd 4
// (working directory /),
// OPENSHELL_WORKSPACE_DIR is a detached copy of the workspace's mount
// (open_tree; the supervisor attaches it with move_mount),
// OPENSHELL_SANDBOX_TOKEN_FILE an fd open on the token file (read from the
// fd; the file stays the gateway's, mode 0600) and, for a unix://
// endpoint, OPENSHELL_ENDPOINT is unix:///proc/self/fd/N/gateway.sock in a
// detached copy of <id>/gateway/, where the driver listens on a socket
// owned by the sandbox's root (0600, directory 0700) and forwards each
// connection to the gateway's own callback socket, which belongs to the
// gateway's user. Next to it the driver serves the host dialer on
// egress-dialer.sock (SOCK_SEQPACKET, same owner and mode; peers whose
// SO_PEERCRED uid is not the sandbox's root host id are refused), so a
// supervisor that outlived the gateway process holding fd 3's other end
// regains its egress. Both live in the gateway process: they stop with
// the supervisor or the driver and are resumed for supervisors found
// running when the driver starts. For a dir: image, OPENSHELL_ROOTFS_LAYER
// is a detached copy of <id>/rootfs-layer/ (owned by the range's root; a
// layer of an earlier version is converted once: owners u < 65536 become
// base+u, trusted.overlay.* attributes user.overlay.*) and
// OPENSHELL_ROOTFS a SOCK_SEQPACKET socket: right after the start the
// driver opens the supervisor's /proc/<pid>/ns/user, makes a detached,
// read-only copy of the image directory's mount (open_tree), id-maps it
// into that namespace (mount_setattr, MOUNT_ATTR_IDMAP) and sends it with
// SCM_RIGHTS; the supervisor waits for it before it mounts anything, and
// exits if the socket closes without it. A supervisor without an id range
// (a gateway not running as root) gets the same directory and sockets
// (OPENSHELL_ENDPOINT names the directory by its path), owned by and
// checked against the gateway's own host uid, which is the uid it runs as,
// and the image and layer by path. The supervisor closes or marks
// close-on-exec every inherited fd, so none reaches a sandbox process.
//
// And, because Go cannot run code between clone and exec, these requests
// that the supervisor performs at start, as pid 1 of its namespaces and
// before it dials the gateway (internal/supervisor implements them in
// setupNamespaces):
//
//	OPENSHELL_PRIVATE_TMP         "true" (always): first make / recursively private
//	                              (mount(NULL, "/", NULL, MS_REC|MS_PRIVATE)), so nothing
//	                              the sandbox mounts reaches the host; then build the
//	                              sandbox's own root and pivot into it (below)
//	OPENSHELL_SANDBOX_HOSTNAME    sethostname(2) to the sandbox name (its own uts namespace)
//	OPENSHELL_PRIVATE_NETWORK     "true" (always): bring up lo in its own network namespace and
//	                              refuse to start if any other interface is there
//	OPENSHELL_ROOTFS              set only for a local rootfs image: the root is the image
//	                              (under a root gateway an inherited socket, see above)
//	OPENSHELL_ROOTFS_LAYER        with OPENSHELL_ROOTFS: <state_dir>/sandboxes/<id>/rootfs-layer
//	                              (under a root gateway an inherited detached mount of it),
//	                              the image's per-sandbox writable layer
//
// The sandbox's root is assembled at a staging mount on /tmp (every source
// is pinned by an fd or resolved first) and entered with pivot_root(".",
// ".") and a lazy unmount of the old root, so the host's filesystem is gone
// from the supervisor's mount namespace:
//
// Without an image: a tmpfs root holding recursive read-only binds of the
// host's /bin, /sbin, /lib, /lib32, /lib64, /libx32 and /usr (a symlink
// such as usrmerge's /bin -> usr/bin is recreated as a symlink) and of
// /etc, filtered: shadow, gshadow (and their backups), security/opasswd,
// ssh/ssh_host_*_key, ssl/private and openshell/ are covered by an empty
// file or directory, and passwd and group are replaced by copies that add
// a "sandbox" user and group (uid and gid 1000, or the next id the host
// does not use; an existing sandbox user is kept); /var/tmp -> /tmp; the
// tmpfs root itself is read-only after the pivot. /opt, /home, /root,
// /srv, /mnt, /var, /run, /sys and the gateway's state directory are not
// there at all.
//
// With an image ("dir:/path" or "/path"): an overlay whose lower layer is
// the image (read-only) and whose upper and work directories are
// <layer>/upper and <layer>/work; where the kernel refuses the overlay, a
// private copy of the image in <layer>/copy (directories, regular files and
// symlinks with their modes and owners; device nodes, fifos and sockets are
// skipped), reused on later starts. Writes stay in the sandbox's layer,
// which survives stop/start and is removed on delete; the image directory
// is never written and other sandboxes never see them. After the pivot
// the image's own system directories are made read-only (every mount under
// /usr, /bin, /sbin, /lib*, /etc and /opt, repeating its
// nosuid/nodev/noexec/atime flags, which a user namespace locks).
//
// Both: the workspace bound at /sandbox (the main process, exec and SSH
// start there; OPENSHELL_WORKSPACE_DIR=/sandbox for them, HOME=/sandbox
// unless the spec sets it); a fresh proc for the sandbox's pid namespace
// (a failure is fatal: the host's /proc would lead out of the root); a
// tmpfs /dev holding bind mounts of the host's null, zero, full, random,
// urandom and tty, a new devpts instance (ptmx -> pts/ptmx), /dev/shm and
// the fd symlinks (no block devices); a fresh tmpfs on /tmp. The directory
// of a unix:// gateway socket is bound read-only at /dev/.openshell-gateway
// for the pivot, re-opened through that bind and detached again: the
// supervisor reaches the socket through its fd, the sandbox does not see
// the directory. Missing mount points (sandbox, proc, dev, tmp) are created
// in the root (in an image: in its writable layer); existing ones must be
// real directories, not symlinks. The supervisor keeps running from its
// already-open binary and has read its token file before; the main process
// and SSH sessions run the root's /bin/sh (/bin/bash when present). Any
// failed step makes the supervisor exit non-zero with the step and path in
// supervisor.log, so the sandbox goes to ERROR.
//
// What this protects: the gateway's state directory (TLS and JWT keys,
// the database, every sandbox's token and workspace), other sandboxes,
// /root, /home and the host's devices are not in the sandbox's filesystem;
// system directories and images cannot be written; the host's /tmp and
// process list are hidden; in a user namespace with its own range the
// sandbox's root is an unprivileged host id. What it does not: the
// sandbox's processes run as
// root of their namespaces with full capabilities there unless the
// supervisor drops them (see internal/supervisor), so one that means to can
// remount the read-only directories writable again (in the sandbox's
// own mount namespace: the image stays unchanged, the writes go to the
// layer). The token
// file is read by the supervisor before the pivot and is not in the
// sandbox's root; the variable naming it is removed from the environment
// of sandbox processes.
//
// OPENSHELL_SANDBOX_TOKEN, OPENSHELL_SANDBOX_TOKEN_FILE, OPENSHELL_ROOTFS and
// OPENSHELL_ROOTFS_LAYER from the spec or template environment are dropped:
// only the driver sets them, and the token itself never travels in the
// environment.
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
