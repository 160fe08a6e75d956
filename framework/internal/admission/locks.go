package admission

import "sync"

// Locks is a set of per-volume locks. TryAcquire never blocks: the CSI spec
// wants Aborted for a second concurrent operation on one volume. The zero
// value is ready to use.
type Locks struct{ m sync.Map }

// TryAcquire takes id's lock, or reports that another operation holds it.
func (l *Locks) TryAcquire(id string) bool {
	_, held := l.m.LoadOrStore(id, struct{}{})
	return !held
}

// Release gives id's lock back.
func (l *Locks) Release(id string) { l.m.Delete(id) }
