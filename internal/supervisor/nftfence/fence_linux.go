package nftfence

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table (family inet) a fence owns.
const TableName = "openshell_fence"

// Config says whom a fence confines and where they may go.
type Config struct {
	// UID and GID are the agent's: a socket owned by either is fenced.
	// Neither may be 0 (the supervisor's).
	UID, GID uint32
	// Proxy is the egress proxy's loopback address, the one destination
	// fenced sockets may open connections to.
	Proxy netip.AddrPort
	// Table names the table; empty means TableName.
	Table string
}

// Fence is an installed fence.
type Fence struct {
	table *nftables.Table
}

// Install replaces the fence table in the current network namespace (a
// leftover of an earlier run included) in one netlink batch: either the
// whole new table is in force afterwards or, on error, nothing changed.
// The error names a missing CAP_NET_ADMIN or kernel support.
func Install(cfg Config) (*Fence, error) {
	if cfg.UID == 0 || cfg.GID == 0 {
		return nil, fmt.Errorf("nftables fence: uid %d gid %d: the agent's ids must not be 0, the supervisor's", cfg.UID, cfg.GID)
	}
	if !cfg.Proxy.Addr().IsLoopback() || cfg.Proxy.Port() == 0 {
		return nil, fmt.Errorf("nftables fence: proxy %s is not a loopback address and port", cfg.Proxy)
	}
	if cfg.Table == "" {
		cfg.Table = TableName
	}
	c, err := nftables.New()
	if err != nil {
		return nil, explain(cfg.Table, err)
	}
	t := &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet}
	// add+delete+add: replaces a leftover table, and works without one.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	agent := c.AddChain(&nftables.Chain{Name: "agent", Table: t})
	for _, r := range rules(cfg, out, agent) {
		c.AddRule(r)
	}
	if err := c.Flush(); err != nil {
		return nil, explain(cfg.Table, err)
	}
	return &Fence{table: t}, nil
}

// Remove deletes the fence's table; the agent's sockets are then no
// longer fenced.
func (f *Fence) Remove() error {
	c, err := nftables.New()
	if err != nil {
		return explain(f.table.Name, err)
	}
	c.DelTable(f.table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables fence: remove table inet %s: %w", f.table.Name, err)
	}
	return nil
}

// explain says what an installation error means for the operator.
func explain(table string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("nftables fence: install table inet %s: %w (the supervisor lacks CAP_NET_ADMIN in its network namespace)", table, err)
	case errors.Is(err, unix.EPROTONOSUPPORT), errors.Is(err, unix.EAFNOSUPPORT), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOENT):
		return fmt.Errorf("nftables fence: install table inet %s: %w (the kernel lacks nf_tables, its inet family, conntrack or reject support)", table, err)
	}
	return fmt.Errorf("nftables fence: install table inet %s: %w", table, err)
}

// rules are, in nft syntax:
//
//	chain output { type filter hook output priority filter; policy accept;
//		meta skuid UID jump agent
//		meta skgid GID jump agent }
//	chain agent {
//		oifname "lo" ct state established,related accept
//		oifname "lo" meta nfproto ipv4 ip daddr PROXY tcp dport PORT accept
//		meta l4proto tcp reject with tcp reset
//		reject with icmpx admin-prohibited }
//
// The first agent rule lets the agent answer on loopback (the supervisor
// relays to the agent's loopback listeners); it never lets a connection
// out, and replies to a peer outside the pod are rejected.
func rules(cfg Config, out, agent *nftables.Chain) []*nftables.Rule {
	rule := func(c *nftables.Chain, e ...expr.Any) *nftables.Rule {
		return &nftables.Rule{Table: c.Table, Chain: c, Exprs: e}
	}
	jump := &expr.Verdict{Kind: expr.VerdictJump, Chain: agent.Name}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	lo := meta(expr.MetaKeyOIFNAME, ifname("lo"))
	proxy := []expr.Any{}
	proxy = append(proxy, lo...)
	if a := cfg.Proxy.Addr(); a.Is4() {
		proxy = append(proxy, meta(expr.MetaKeyNFPROTO, []byte{unix.NFPROTO_IPV4})...)
		proxy = append(proxy, payload(expr.PayloadBaseNetworkHeader, 16, a.AsSlice())...)
	} else {
		proxy = append(proxy, meta(expr.MetaKeyNFPROTO, []byte{unix.NFPROTO_IPV6})...)
		proxy = append(proxy, payload(expr.PayloadBaseNetworkHeader, 24, a.AsSlice())...)
	}
	proxy = append(proxy, meta(expr.MetaKeyL4PROTO, []byte{unix.IPPROTO_TCP})...)
	proxy = append(proxy, payload(expr.PayloadBaseTransportHeader, 2, binaryutil.BigEndian.PutUint16(cfg.Proxy.Port()))...)
	proxy = append(proxy, accept)

	established := append(append([]expr.Any{}, lo...),
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
		accept)
	tcpReset := append(meta(expr.MetaKeyL4PROTO, []byte{unix.IPPROTO_TCP}),
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})

	return []*nftables.Rule{
		rule(out, append(meta(expr.MetaKeySKUID, binaryutil.NativeEndian.PutUint32(cfg.UID)), jump)...),
		rule(out, append(meta(expr.MetaKeySKGID, binaryutil.NativeEndian.PutUint32(cfg.GID)), jump)...),
		rule(agent, established...),
		rule(agent, proxy...),
		rule(agent, tcpReset...),
		rule(agent, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}),
	}
}

// meta loads key and compares it with want.
func meta(key expr.MetaKey, want []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: want},
	}
}

// payload loads len(want) bytes at offset of base and compares them.
func payload(base expr.PayloadBase, offset uint32, want []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: uint32(len(want))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: want},
	}
}

// ifname is name as the kernel compares interface names (IFNAMSIZ bytes).
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}
