package exec

import (
	"context"
	"errors"
	"sync"

	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// sshPool keeps one SSH connection per sandbox, over one relay, and runs
// every exec as a new session on it: the relay set-up and SSH handshake
// are paid once per sandbox instead of once per command. A connection that
// dies (supervisor restart, sandbox stop) removes itself.
type sshPool struct {
	relay   *relay.Registry
	mu      sync.Mutex
	clients map[string]*sshexec.Client
	wg      sync.WaitGroup
}

func newSSHPool(r *relay.Registry) *sshPool {
	return &sshPool{relay: r, clients: map[string]*sshexec.Client{}}
}

func (p *sshPool) get(ctx context.Context, sandboxID string) (*sshexec.Client, error) {
	p.mu.Lock()
	c := p.clients[sandboxID]
	p.mu.Unlock()
	if c != nil {
		return c, nil
	}
	conn, err := p.relay.OpenRelay(ctx, sandboxID, relay.SSHTarget())
	if err != nil {
		return nil, err
	}
	c, err = sshexec.Dial(ctx, conn, sshexec.Liveness{})
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if existing := p.clients[sandboxID]; existing != nil {
		p.mu.Unlock()
		_ = c.Close() // lost a race with a concurrent first exec
		return existing, nil
	}
	p.clients[sandboxID] = c
	p.mu.Unlock()
	p.wg.Go(func() {
		_ = c.Wait()
		p.drop(sandboxID, c)
	})
	return c, nil
}

// drop forgets c (only if it is still the pooled client) and closes it.
func (p *sshPool) drop(sandboxID string, c *sshexec.Client) {
	p.mu.Lock()
	if p.clients[sandboxID] == c {
		delete(p.clients, sandboxID)
	}
	p.mu.Unlock()
	_ = c.Close() // best effort: the connection is being discarded
}

// dropSandbox closes the pooled connection of a sandbox, if any.
func (p *sshPool) dropSandbox(sandboxID string) {
	p.mu.Lock()
	c := p.clients[sandboxID]
	delete(p.clients, sandboxID)
	p.mu.Unlock()
	if c != nil {
		_ = c.Close() // best effort: the connection is being discarded
	}
}

// run executes req on the sandbox's pooled connection, dialing again once
// when the pooled connection turns out to be dead.
func (p *sshPool) run(ctx context.Context, sandboxID string, req sshexec.Request) (int, error) {
	for attempt := 0; ; attempt++ {
		c, err := p.get(ctx, sandboxID)
		if err != nil {
			return -1, err
		}
		code, err := sshexec.Run(ctx, c, req)
		if errors.Is(err, sshexec.ErrSession) && attempt == 0 {
			p.drop(sandboxID, c)
			continue
		}
		return code, err
	}
}

// close ends every pooled connection and joins their watchers.
func (p *sshPool) close() {
	p.mu.Lock()
	clients := p.clients
	p.clients = map[string]*sshexec.Client{}
	p.mu.Unlock()
	for _, c := range clients {
		_ = c.Close() // best effort on shutdown
	}
	p.wg.Wait()
}
