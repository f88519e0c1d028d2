// Package lifecycle owns sandbox state and lifecycle on the gateway.
//
// The gateway, not the driver, owns the public phase. Intent is persisted
// before compute is touched (Ready → Stopping → Stopped → Starting → Ready;
// Deleting), per-sandbox gates serialize stop/start/delete within a replica,
// and resource versions (compare-and-swap writes) are the boundary across
// replicas. The public phase is composed from three inputs: the persisted
// phase (user intent and the sticky ERROR), the backend's conditions as the
// driver reports them, and whether the sandbox's supervisor session is
// connected: READY means backend ready AND session connected.
package lifecycle
