// Package memstore is an in-memory [store.Store] for unit tests and the driver test
// harness.
//
// # Semantics
//
// It behaves like boltstore except that nothing survives the process: Put and Get
// deep-copy records so callers never alias the store's state, List is ordered by
// volume ID, and every call after Close fails.
//
// Like boltstore's Store it has an ID method (a random identity made by [New], or
// the one given to [NewWithID]), so that framework tests can use the identity the
// framework finds by type assertion.
package memstore
