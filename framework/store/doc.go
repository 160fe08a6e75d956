// Package store defines the durable per-volume state of an Ephemera driver: one
// versioned [Record] per volume, keyed by volume ID, kept by a [Store] (five
// methods: Get, Put, Delete, List, Close; [Relaxed] and [Identifier] are the
// optional capabilities). Implementations live in
// boltstore (production, bbolt) and memstore (unit tests); both pass the
// conformance suite in storetest.
package store
