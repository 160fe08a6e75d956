// Package memstore is an in-memory [store.Store] for unit tests and the driver test
// harness.
//
// # Semantics
//
// It behaves like boltstore except that nothing survives the process: Put and Get
// deep-copy records so callers never alias the store's state, List is ordered by
// volume ID, and every call after Close fails.
package memstore
