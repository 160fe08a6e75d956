// Package storage is the lifecycle's hands on the backends and the state
// store (internal/lifecycle calls it; it calls nothing back). Its core type
// is Storage: Backend.Create, Delete and List timed into the metrics, what a
// Finder finds, the refusal to delete storage that is still mounted
// anywhere, and how a record is written — durably, or relaxed for a backend
// whose volumes are nothing but their mounts (Relaxed, NeedsIntent). It sees
// a backend as Backend: the few methods of the lifecycle's view of one that
// it uses.
package storage
