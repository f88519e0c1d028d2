// Package lifecycle owns sandbox state and lifecycle on the gateway.
//
// The gateway, not the driver, owns the public phase. Intent is persisted
// before compute is touched (Ready → Stopping → Stopped → Starting → Ready;
// Deleting), and resource versions (compare-and-swap writes) are the
// boundary across replicas. The public phase is composed from three inputs:
// the persisted phase (user intent and the sticky ERROR), the backend's
// conditions as the driver reports them, and whether the sandbox's
// supervisor session is connected: READY means backend ready AND session
// connected.
//
// # One write path
//
// Within a replica, a sandbox's row and the engine's view of it (backend
// snapshot, session) change only under that sandbox's gate. Create and
// Adopt take the gate before the row is inserted, so no delete, stop or
// event sees a row whose driver call has not happened yet. Stop, Start,
// Delete and recovery hold the gate for their whole operation. Driver
// events, session changes, main-process exits and policy-version reports
// are posted to the gate: they run at once when it is free, or are run by
// the holder before it releases the gate, so neither the driver watch nor
// the relay ever waits for a long operation (a stop waiting for its
// supervisor to exit). The phase is recomposed inside the compare-and-swap
// retry from the state current at that attempt. Events and sessions of
// sandboxes without a row change nothing and are not remembered; gates
// leave the engine's map with their last user, and a sandbox's state with
// its row.
//
// Every row delete is conditional on the version the decision was made
// from (a concurrent change is read again and decided again, then
// Aborted), and the store removes the sandbox's scoped records (policy
// revisions, settings, draft policy chunks) in the same transaction.
//
// A create checks its workspace again after the insert, under the gate
// (Options.WorkspaceAccepts): a workspace delete marks the workspace
// TERMINATING before it counts sandboxes, so either the count sees the new
// row or the create sees TERMINATING and removes its row before the driver
// is asked.
package lifecycle
