// Package boltstore is the production [store.Store]: one bbolt file per driver,
// normally under the driver's state directory on the node.
//
// # Layout
//
// The file holds three buckets:
//
//   - "volumes" maps a volume ID to its JSON-encoded [store.Record].
//   - "meta" holds "schemaVersion", the file's layout version ([SchemaVersion], in
//     decimal), and "storeID", the store's identity (below). A file written by a
//     newer driver is refused with an error wrapping [store.ErrVersion] rather
//     than misread after a downgrade; so is a file holding a record of a newer
//     [store.RecordVersion].
//   - "quarantine" holds records that did not decode, moved out of "volumes" by
//     [Open]: the key is the volume ID ("<id>#2", "<id>#3"... if the same volume
//     is quarantined again), the value the raw bytes. Nothing in it is ever
//     deleted; it is evidence for an operator (see [Inspect]). The bucket exists
//     once something has been quarantined.
//
// "volumes" and "meta" are created together, so a file with only one of them is
// damaged. A file with no buckets at all (bbolt created it, but the driver
// stopped before its first commit) is a new, empty store.
//
// # Identity
//
// "storeID" is 128 random bits in hex, written when the file is created, or when
// an older file without one is first opened; [Store.ID] returns it. It names this
// file, not the node: a new file is a new identity, even at the same path, so a
// file that was damaged, moved aside and rebuilt has a new one. The framework
// stamps the storage areas of its backends with the ID; finding its own ID on a
// storage area proves that the store has known that storage all along, while a
// different or missing ID means the storage predates the current state file.
//
// # Damaged files
//
// bbolt maps the file into memory and trusts it: a truncated file makes it fault
// (SIGBUS) and a damaged page trips its assertions, both of which kill the whole
// process. [Open] never lets that happen, whatever bytes the file holds:
//
//  1. Validation before mapping. Open locks the file (the lock bbolt takes, on
//     the file bbolt then uses) and checks it with plain reads: an empty file, a
//     file shorter than two pages, two invalid meta pages (magic, version,
//     FNV-64a checksum; bbolt's choice of the valid meta page with the higher
//     txid is followed, so a torn meta page falls back to the other one, as in
//     bbolt), a high-water mark past the end of the file, root or freelist
//     pages out of range, an unsaved freelist (this store always saves it, and
//     bbolt rebuilds a missing one on a goroutine whose panics cannot be
//     recovered), and a freelist page of the wrong type, with a wrong count or
//     listing pages out of range, twice, or in use. It then walks every page
//     reachable from the root bucket: each must lie inside the file, carry its
//     own page ID and a branch or leaf type, be reached once, hold its elements,
//     keys and values inside itself, with non-empty keys in order, and start
//     with the key its parent has for it (bbolt relies on that when it writes).
//  2. Protected open and walk. Open then opens the file with bbolt and reads
//     every bucket, key and value on a goroutine that calls
//     debug.SetPanicOnFault and recovers, so that damage the validation missed
//     turns into an error too. (bbolt's own tx.Check runs on a goroutine of its
//     own, where a panic cannot be recovered, so it is not used.)
//  3. Quarantine. Finally Open decodes every record. One that does not decode
//     (damaged JSON, or a record stored under another volume's key) is moved to
//     "quarantine" in one transaction with its removal from "volumes", and
//     [Store.Quarantined] names it: the framework rebuilds that volume from the
//     node. A record of a newer version is not damage: Open refuses the file.
//
// Damage found in steps 1 and 2 is an error wrapping [ErrCorrupt] that names the
// file and what is wrong with it; nothing in a damaged file is changed. The
// framework then keeps what [Salvage] can still read, moves the file aside and
// rebuilds the state from the node (docs/operations.md, "Damaged state").
//
// New files are created whole: bbolt initialises a temporary file, which is
// hard-linked into place. So an empty file at the store's path is always damage
// (for example a file system that lost the data of an unsynced file), never a
// file being created.
//
// # Inspection
//
// [Inspect] reads a file for an operator, read-only and protected the same way,
// and [Salvage] reads the records of a damaged file page by page without bbolt.
// Both take a shared lock, which they cannot get while a driver has the store
// open: they fail with [ErrLocked] after a timeout rather than read a file that
// is being written.
//
// # Durability and batching
//
// Put and Delete are durable when they return (bbolt fsyncs the commit);
// [Store.PutRelaxed] and [Store.DeleteRelaxed] skip the fsync, which the next
// durable commit, a sync at most [RelaxedSyncInterval] later, or Close makes.
// Writes go through a group commit of the store's own, not bbolt's Batch: a
// writer that finds no commit running commits at once, and writers arriving
// meanwhile share the next transaction and its fsync, so a lone writer never
// waits for a timer and concurrent publishes on a busy node share one commit
// (docs/design.md, "Durability").
//
// # Locking
//
// bbolt takes an exclusive lock on the file (flock on Unix, LockFileEx on
// Windows). Only one driver process per node can own the store; a second one (for
// example a second DaemonSet pod during a botched rollout) fails in [Open] after
// [Options].Timeout with an error wrapping [ErrLocked]. On Windows, where a lock
// cannot be taken twice on one handle, Open releases its lock for the moment
// between its check and bbolt's own locking.
package boltstore
