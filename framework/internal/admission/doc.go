// Package admission decides which volume operations a node takes on now:
// the per-volume locks (Locks) and the node's bounded resources partitioned
// by the party that uses them (Pool), so that one party (a plugin whose
// calls never end, a backend that hangs) can exhaust only its own share.
//
// # Pools
//
// A Pool has a total, a reserve for each party that no other party can
// take, and a shared remainder each party may borrow from up to its own
// maximum. The framework keeps several: the publish lane (slots of
// publishes in flight, fail fast), the teardown lane (slots of unpublishes
// and garbage collection, each party's own, never shared with publishes),
// the content budget (bytes of content answers in flight, waited for) and
// the refresh lane. docs/security.md, "Bulkheads", says which party each is
// partitioned by and why.
//
// The package is a leaf: it imports nothing of the module, so that every
// part of the framework that admits work can use it.
package admission
