// Package exec implements the RPCs that reach into a running sandbox over
// supervisor relays: ExecSandbox and ExecSandboxInteractive (an SSH client
// in the gateway against the supervisor's SSH server), CreateSshSession /
// RevokeSshSession, and ForwardTcp (SSH or a loopback TCP port inside the
// sandbox, authorized by an SSH session token).
//
// A user must be allowed to see the sandbox (authz); a sandbox principal
// may act only for its own sandbox. Execs share one pooled SSH connection
// per sandbox.
package exec

import (
	"time"

	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire a Service.
type Options struct {
	Relay *relay.Registry
	Store store.Store
	Authz *authz.Authorizer
	// SSHSessionTTL bounds CreateSshSession tokens; 0 means no expiry.
	SSHSessionTTL time.Duration
	// Gateway address reported in CreateSshSession responses.
	GatewayHost   string
	GatewayPort   uint32
	GatewayScheme string
	// Connection caps for ForwardTcp (0 = defaults).
	MaxForwardsPerToken   int
	MaxForwardsPerSandbox int
	Now                   func() time.Time
}

// Service implements the exec, SSH session and forwarding RPCs. It is
// safe for concurrent use; Close ends its pooled connections.
type Service struct {
	o        Options
	forwards *forwardCounter
	ssh      *sshPool
}

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxForwardsPerToken == 0 {
		o.MaxForwardsPerToken = 16
	}
	if o.MaxForwardsPerSandbox == 0 {
		o.MaxForwardsPerSandbox = 64
	}
	return &Service{
		o:        o,
		forwards: newForwardCounter(o.MaxForwardsPerToken, o.MaxForwardsPerSandbox),
		ssh:      newSSHPool(o.Relay),
	}
}

// DropSandbox closes the pooled SSH connection of a deleted sandbox.
func (s *Service) DropSandbox(sandboxID string) { s.ssh.dropSandbox(sandboxID) }

// Close ends every pooled connection and joins their watchers.
func (s *Service) Close() { s.ssh.close() }
