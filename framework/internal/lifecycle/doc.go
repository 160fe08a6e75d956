// Package lifecycle runs the life of a driver's volumes: the transition table
// and one function per event (lifecycle.go), and the collaborators the events
// call down into — the backends (Backend), the refreshes (refresh.go; what
// they write is internal/fill's) and the wiring of long provisioning
// (provisioning.go) and of the reconcile's node view and the orphan GC
// (reconcile.go); the backends' calls and the records, capacity, the
// bulkheads, the refreshes' timers, long provisioning's runner, the content,
// the startup reconcile's view of the node and the orphan GC are packages
// below it (internal/storage, internal/capacity, internal/lanes,
// internal/refresh, internal/provision, internal/fill, internal/reconcile).
// Its core type is Engine, built from a Config by package framework, which
// feeds it the CSI publish and unpublish calls, the startup and RebuildState.
package lifecycle
