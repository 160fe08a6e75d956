package framework

import "context"

// Hooks into the stats walks of directory volumes for the external tests.

// SetStatsWalkHook makes every later walk of d call visited after each entry,
// with the walk's context and the running count of entries.
func SetStatsWalkHook(d *Driver, visited func(ctx context.Context, entries int64)) {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	d.stats.visited = visited
}

// StatsWalks is the number of walks d started.
func StatsWalks(d *Driver) int64 { return d.stats.walks.Load() }

// StatsWaiters is the number of calls waiting for the walk of volume id.
func StatsWaiters(d *Driver, id string) int { return d.stats.waiting(id) }

// StatsCached is the number of volumes with a stats answer or walk.
func StatsCached(d *Driver) int { return d.stats.size() }

// WaitStatsWalks waits for d's walks in progress to end. Walks start under
// the cache's lock: taking it orders their start before the Wait for the race
// detector (an RPC through a socket does not).
func WaitStatsWalks(d *Driver) {
	d.stats.mu.Lock()
	//lint:ignore SA2001 an empty critical section, for its ordering
	d.stats.mu.Unlock()
	d.stats.running.Wait()
}

// StatsForget drops the stats answer of volume id.
func StatsForget(d *Driver, id string) { d.stats.forget(id) }
