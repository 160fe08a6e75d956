// Package boltstore is the production [store.Store]: one bbolt file per driver,
// normally under the driver's state directory on the node.
//
// # Layout
//
// The file holds two buckets. "volumes" maps a volume ID to its JSON-encoded
// [store.Record]. "meta" holds the file's schema version, checked by [Open]: a file
// written by a newer driver is refused with an error wrapping [store.ErrVersion]
// rather than misread after a downgrade.
//
// # Durability and batching
//
// Put and Delete are durable when they return (bbolt fsyncs the commit). Both go
// through bbolt's Batch, so concurrent publishes on a busy node share one
// transaction and one fsync. The price is latency for a lone writer: a batch waits
// 1ms for company before it commits (bbolt's default of 10ms cost more than the
// fsync it saves).
//
// # Locking
//
// bbolt takes an exclusive lock on the file (flock on Unix, LockFileEx on
// Windows). Only one driver process per node can own the store; a second one (for
// example a second DaemonSet pod during a botched rollout) fails in [Open] after
// [Options].Timeout with an error wrapping [ErrLocked].
package boltstore
