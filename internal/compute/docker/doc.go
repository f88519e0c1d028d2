// Package docker is the compute driver that runs each sandbox as a Docker
// Engine container, through the official Go client (API version
// negotiated with the daemon; Docker Engine 20.10, API 1.41, is the oldest
// tested).
//
// # Containers
//
// Each sandbox is one container named openshell-<sandbox id> with a named
// volume openshell-<sandbox id>-workspace mounted at /sandbox. Both carry
// the labels openshell.ai/managed-by, openshell.ai/gateway-id,
// openshell.ai/sandbox-id, openshell.ai/sandbox-name (and
// openshell.ai/workspace, openshell.ai/namespace when set). The gateway
// id is created once in <state_dir>/docker/gateway-id, so several gateways
// can share one Engine; the driver only ever lists, watches and changes
// containers with its own gateway id.
//
// The container's entrypoint is the gateway's own openshell-sandbox binary
// (supervisor_bin, default: next to the gateway, else $PATH), bind-mounted
// read-only at /opt/openshell/bin/openshell-sandbox, so any image works,
// including FROM scratch ones. It runs without arguments as the
// container's pid 1, as root of the container, with:
//
//   - network mode none: the container has a loopback interface only;
//     the supervisor's egress proxy (OPENSHELL_PRIVATE_NETWORK) dials
//     upstream through the driver's host dialer (package hostdial), a
//     socket served per sandbox in <state_dir>/docker/egress/<id>
//     (directory 0700, socket 0600, root's, peers of uid 0 only),
//     bind-mounted read-only at EgressDir and named by
//     OPENSHELL_EGRESS_DIALER_PATH. A re-attaching driver serves it
//     again; Delete removes it. Only with a root gateway and an Engine
//     that does not remap users (userns-remap, rootless): otherwise
//     containers get no dialer and no egress, and network_policies are
//     reported FAILED;
//   - the directory of the gateway's unix callback socket (sandbox RPCs
//     only) bind-mounted read-only at /run/openshell/gateway, which is how
//     the supervisor reaches the gateway (OPENSHELL_ENDPOINT); the
//     directory, not the socket file, so a restarted gateway's new socket
//     is seen by running containers;
//   - all capabilities dropped but CHOWN, KILL, SETGID, SETPCAP and SETUID
//     (what the supervisor needs to start agent processes as an
//     unprivileged user; plus DAC_OVERRIDE when the gateway does not run
//     as root, to reach its socket), no-new-privileges, Docker's default
//     seccomp profile, no restart policy, no init process (the supervisor
//     reaps), a fresh tmpfs on /tmp;
//   - the sandbox JWT in /.openshell/token (mode 0600, directory 0700,
//     both root's), copied into the container's writable layer through the
//     Engine's archive API before the first start. It is never in the
//     container's environment, labels or command line.
//
// Environment: template environment, then spec environment, then
// HOME=/sandbox unless set, then OPENSHELL_SANDBOX_ID, OPENSHELL_SANDBOX_NAME,
// OPENSHELL_ENDPOINT, OPENSHELL_SANDBOX_TOKEN_FILE, OPENSHELL_SANDBOX_COMMAND
// (JSON argv; an empty array is the supervisor's default shell, not the
// image's CMD), OPENSHELL_SANDBOX_TTY, OPENSHELL_LOG_LEVEL and
// OPENSHELL_WORKSPACE_DIR=/sandbox, OPENSHELL_PRIVATE_NETWORK=true and,
// with a dialer, OPENSHELL_EGRESS_DIALER_PATH (and the test-only
// OPENSHELL_EGRESS_TEST_HOSTS copied from the gateway's own environment),
// which cannot be overridden; any OPENSHELL_SANDBOX_TOKEN* and
// OPENSHELL_EGRESS_* variable of the spec is dropped. The working
// directory and hostname are /sandbox and the sandbox name.
//
// Resources: cpu limit -> NanoCPUs, cpu request -> CPU shares (1024 per
// cpu), memory limit -> memory limit, memory request -> memory
// reservation, sandbox_pids_limit -> pids limit, GPUs -> a device request
// for that many GPUs with the "gpu" capability (the Engine needs the NVIDIA
// container toolkit; without it Create fails with FailedPrecondition and
// leaves nothing behind). A runtime class, annotations, user namespaces and
// driver_config keys are refused (InvalidArgument).
//
// # Images
//
// image_pull_policy IfNotPresent (default) uses a local image and pulls an
// absent one; Always pulls every time; Never refuses an absent image at
// ValidateCreate (FailedPrecondition). Without a pull, Create creates and
// starts the container before it returns. With one, Create returns once
// the sandbox is recorded as pulling (Ready=False/Pulling, in memory only):
// the pull's progress is a stream of platform events, and a failure leaves
// the sandbox at Ready=False/ErrImagePull (Kubernetes' reason, which the
// gateway turns into phase ERROR) with a warning event naming the image
// and the Engine's error, until it is deleted. A gateway that
// dies during a pull loses the pull; the gateway then removes the
// sandbox, whose create never finished.
//
// # Lifecycle and recovery
//
// Stop marks the sandbox stopped (<state_dir>/docker/stopped/<id>) and
// stops the container (SIGTERM, SIGKILL after stop_timeout_secs); its
// writable layer and workspace volume stay. Start starts the same
// container again. Delete removes the container (forced) and its volume.
// The driver keeps no other state: after a gateway restart, even after
// kill -9, it finds its containers by label, and running containers are
// never touched by Close or by the gateway's shutdown
// (GatewayManagesLifecycle is false). Orphans (containers whose sandbox
// the gateway does not know) are deleted by the gateway's recovery. When
// the driver opens it removes what an interrupted create of this gateway
// left: containers created but never started, then workspace volumes
// without their container.
//
// Conditions: running: Ready=True/Running (InstanceID: container id and
// start time, new on every start); created: Ready=False/Starting; stopped
// by Stop: Ready=False/Stopped and Suspended=True/Stopped; exited on its
// own: Ready=False/ProcessExited with the exit code.
//
// Watch starts with a snapshot of every sandbox, then follows the
// Engine's container events for this gateway id (each read back with an
// inspect) and the driver's pull events; it ends with Unavailable when the
// Engine's event stream breaks.
//
// # Configuration
//
// Keys of [openshell.drivers.docker]: socket_path (default: DOCKER_HOST,
// else /var/run/docker.sock), supervisor_bin, default_image (inherited
// from [openshell.gateway]), image_pull_policy, sandbox_pids_limit (0: no
// limit, the default), stop_timeout_secs (default 10). supervisor_image,
// guest_tls_*, host_gateway_ip and grpc_endpoint are refused when set:
// containers have no network and the supervisor comes from the gateway.
// Other keys of OpenShell's docker driver (sandbox_runtime_image,
// network_name, enable_bind_mounts, the proxy keys, ...) are refused
// unless they hold their zero value.
// A missing socket, a socket the gateway may not use and a socket nobody
// listens on are each a FailedPrecondition naming the socket, when the
// driver opens. The gateway's callback endpoint must be a unix socket.
package docker
