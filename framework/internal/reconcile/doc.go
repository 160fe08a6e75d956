// Package reconcile is what the lifecycle looks at when it compares the node
// with the records: the startup reconcile's view of the node and the orphan
// GC. Its core types are Node, which finds the volumes the node shows
// without a record (mounts at targets, storage in the backends' inventories,
// with the stamp rules) and returns them as Findings, and GC, the orphan GC's
// bookkeeping, passes and loop.
//
// Neither fires an event itself (TestLayers: it cannot import
// internal/lifecycle). The lifecycle's Reconcile fires the reconcile event
// for each Finding, by its Kind; the GC tears a volume down through the
// Remove func it is made with, the lifecycle's gc event, and reaches the
// store, the volume locks, the teardown lanes, the metrics and the events
// through the narrow interfaces and funcs of its GCConfig.
package reconcile
