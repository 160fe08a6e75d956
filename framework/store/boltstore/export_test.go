package boltstore

// OpenUnchecked is Open without the structural check before bbolt maps the file,
// for tests of what the protected open and walk do alone.
func OpenUnchecked(path string, opts Options) (*Store, error) {
	opts.skipCheck = true
	return Open(path, opts)
}

// Unsynced reports whether relaxed commits wait for their sync.
func (s *Store) Unsynced() bool {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return s.group.unsynced || s.group.syncing > 0
}

// CachedRecords is how many decoded records Get answers from memory.
const CachedRecords = cachedRecords
