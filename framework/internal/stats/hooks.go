package stats

import "context"

// What the framework's tests observe of a Cache (framework/export_test.go).

// SetVisited makes every later walk call visited after each entry, with the
// walk's context and the running count of entries.
func (c *Cache) SetVisited(visited func(ctx context.Context, entries int64)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.visited = visited
}

// Walks is the number of walks started.
func (c *Cache) Walks() int64 { return c.walks.Load() }

// Waiting is the number of calls waiting for the walk of volume id.
func (c *Cache) Waiting(id string) int { return c.waiting(id) }

// Size is the number of volumes with an answer or a walk.
func (c *Cache) Size() int { return c.size() }

// WaitIdle waits for the walks in progress to end. Walks start under the
// cache's lock: taking it orders their start before the Wait for the race
// detector (an RPC through a socket does not).
func (c *Cache) WaitIdle() {
	c.mu.Lock()
	//lint:ignore SA2001 an empty critical section, for its ordering
	c.mu.Unlock()
	c.running.Wait()
}
