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
// with FailedPrecondition at ValidateCreate, never ignored.
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
//	                              the sandbox mounts reaches the host, then mount a fresh
//	                              tmpfs on /tmp
//	OPENSHELL_SANDBOX_HOSTNAME    sethostname(2) to the sandbox name (its own uts namespace)
//	OPENSHELL_ROOTFS              set only for a local rootfs image: bind-mount the
//	                              workspace at /sandbox inside it, mount /proc, /dev and
//	                              /tmp there, pivot_root(2) into it and chdir /sandbox; the
//	                              supervisor keeps running from its already-open binary.
//	                              Unset: the sandbox sees the host filesystem; the
//	                              supervisor should remount system directories read-only
//	                              (/usr, /bin, /sbin, /lib*, /etc) and mount a fresh /proc
//	                              for its pid namespace.
//
// OPENSHELL_SANDBOX_TOKEN, OPENSHELL_SANDBOX_TOKEN_FILE and OPENSHELL_ROOTFS
// from the spec or template environment are dropped: only the driver sets
// them, and the token itself never travels in the environment.
//
// The supervisor exits on SIGTERM; the driver sends SIGKILL to the process
// group after stop_grace_secs. Because the supervisor is pid 1 of its pid
// namespace, it must install a SIGTERM handler or it only dies at SIGKILL.
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
