// Package relay is the gateway side of the supervisor relay protocol.
//
// A Registry keeps one live supervisor session per sandbox (the
// ConnectSupervisor stream) and the pending relays the gateway has asked
// supervisors to open. A caller that needs bytes from inside a sandbox (exec
// over SSH, TCP forwarding, service URLs) calls OpenRelay: the registry sends
// RelayOpen on the sandbox's session and waits for the supervisor to dial back
// with a RelayStream call whose first frame is init{channel_id}. The bytes of
// that call are then exposed to the caller as a net.Conn.
//
// The gRPC handlers of the gateway delegate to HandleConnect and
// HandleRelayStream after authentication; they pass the sandbox id of the
// authenticated principal ("" when the caller is not a sandbox principal).
//
// All methods are safe for concurrent use. Errors carry internal/errdefs kinds
// (or a context deadline for "relay channel timed out") so the server's
// interceptor maps them to the documented gRPC codes and messages.
package relay
