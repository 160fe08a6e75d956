package stats

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
)

// Bound says which bounds stopped a walk short (a bit set).
type Bound uint8

const (
	boundEntries  Bound = 1 << iota // MaxEntries reached
	boundDepth                      // a directory at MaxDepth was not listed
	boundTimeout                    // Timeout reached
	boundCanceled                   // every caller went away, or the volume was unpublished
	boundLinks                      // MaxLinkedFiles reached
)

// boundNames are the values of the result label of ephemera_stats_walks_total.
var boundNames = []struct {
	b    Bound
	name string
}{
	{boundEntries, metrics.StatsWalkMaxEntries},
	{boundDepth, metrics.StatsWalkMaxDepth},
	{boundTimeout, metrics.StatsWalkTimeout},
	{boundCanceled, metrics.StatsWalkCanceled},
	{boundLinks, metrics.StatsWalkMaxLinkedFiles},
}

// names lists the bounds in b, or StatsWalkComplete for none.
func (b Bound) Names() []string {
	if b == 0 {
		return []string{metrics.StatsWalkComplete}
	}
	var s []string
	for _, n := range boundNames {
		if b&n.b != 0 {
			s = append(s, n.name)
		}
	}
	return s
}

func (b Bound) String() string { return strings.Join(b.Names(), ",") }

// Result is what a walk counted: a lower bound when stopped is not 0.
type Result struct {
	Bytes, Inodes int64
	Entries       int64 // entries visited, the root included
	Stopped       Bound
}

// walkEntry is one directory entry, stat'ed without following links.
type walkEntry struct {
	name  string
	dir   bool   // a directory (never a link to one)
	bytes int64  // what it counts: allocated bytes on Linux, the logical size of a file on Windows
	dev   uint64 // filesystem; 0 where unknown
	ino   uint64 // with dev, identifies a file with several links; 0: not deduplicated
	links uint64
}

// walkDir is one open directory of a walk: the thin OS-specific part
// (stats_linux.go, stats_windows.go).
type walkDir interface {
	// read returns up to n entries not yet returned (never "." or ".."), and
	// none (io.EOF, or an error) once there are none. An entry that vanished is left out.
	read(n int) ([]walkEntry, error)
	// open opens the directory e listed by read, relative to this directory
	// and without following a link; it fails when e is no longer a directory
	// of the same filesystem.
	open(e walkEntry) (walkDir, error)
	close() error
}

// walkBatch is how many entries a walk reads from a directory at a time.
const walkBatch = 256

// walkTree counts the usage of the tree under root (whose own entry is self)
// like du -x: allocated bytes, one inode per entry, a file with several links
// once; links are never followed and directories of another filesystem (a
// mount point inside the volume) are neither counted nor entered. It stops at
// the first of lim's bounds or when ctx ends (Timeout when ctx's deadline
// passed, Canceled otherwise) and returns what it counted. It closes root.
// visited, when set, is called after each entry is visited with ctx and the
// running count (tests).
func walkTree(ctx context.Context, root walkDir, self walkEntry, lim Limits, visited func(context.Context, int64)) Result {
	res := Result{Bytes: max(self.bytes, 0), Inodes: 1, Entries: 1}
	type level struct {
		dir     walkDir
		pending []walkEntry
	}
	stack := []level{{dir: root}}
	defer func() {
		for _, l := range stack {
			l.dir.close()
		}
	}()
	seen := map[[2]uint64]struct{}{}
	for len(stack) > 0 {
		top := &stack[len(stack)-1]
		if len(top.pending) == 0 {
			ents, err := top.dir.read(walkBatch)
			if len(ents) == 0 {
				_ = err // io.EOF, or the directory vanished while walking: a pod is writing
				top.dir.close()
				stack = stack[:len(stack)-1]
				continue
			}
			top.pending = ents
		}
		e := top.pending[0]
		top.pending = top.pending[1:]
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				res.Stopped |= boundTimeout
			} else {
				res.Stopped |= boundCanceled
			}
			return res
		}
		if res.Entries >= lim.MaxEntries {
			res.Stopped |= boundEntries
			return res
		}
		res.Entries++
		if visited != nil {
			visited(ctx, res.Entries)
		}
		if e.dir && e.dev != self.dev {
			continue // another filesystem mounted inside the volume (du -x)
		}
		if !e.dir && e.links > 1 && e.ino != 0 {
			id := [2]uint64{e.dev, e.ino}
			if _, ok := seen[id]; ok {
				continue
			}
			if lim.MaxLinkedFiles > 0 && len(seen) >= lim.MaxLinkedFiles { // 0: walkTree called without defaults (tests)
				res.Stopped |= boundLinks
				return res
			}
			seen[id] = struct{}{}
		}
		res.Inodes++
		res.Bytes = addSat(res.Bytes, e.bytes)
		if !e.dir {
			continue
		}
		if len(stack) >= lim.MaxDepth { // e is at depth len(stack)
			res.Stopped |= boundDepth
			continue
		}
		child, err := top.dir.open(e)
		if err != nil {
			continue // vanished, or replaced by a link: not followed
		}
		stack = append(stack, level{dir: child})
	}
	return res
}

// errWalkCanceled ends a walk nobody waits for any more.
var errWalkCanceled = errors.New("volume stats walk canceled")

// Cache shares the walks of directory volumes: concurrent calls for one
// volume wait for one walk, and its answer is reused for CacheTTL. A walk runs
// under its own deadline (Timeout), detached from its callers, each of whom
// waits with its own context; when the last of them has gone the walk is
// canceled and its answer dropped, so a canceled caller never leaves a short
// count for the others. Entries are keyed by volume ID and checked against the
// record's target and creation time, dropped on unpublish (forget) and swept
// once expired.
type Cache struct {
	lim Limits
	now func() time.Time

	mu    sync.Mutex
	swept time.Time // the last sweep of expired answers
	// Observe, when set before the first Usage, is told how every walk that
	// did not fail ended
	// (the metric). Under mu.
	Observe func(Bound)
	entries map[string]*statsWalk
	// slots are the node's walks in progress (MaxConcurrent): a walk sends
	// before it starts and receives when it ends.
	slots chan struct{}

	// Tests.
	walks   atomic.Int64                 // walks started
	running sync.WaitGroup               // walks in progress
	visited func(context.Context, int64) // under mu: called per entry of every walk
}

// Key identifies one publication of a volume: a volume unpublished and
// published again (the same ID) has a new record.
type Key struct {
	Target  string
	Created time.Time
}

// statsWalk is one walk of one volume, in progress or done.
type statsWalk struct {
	key      Key
	done     chan struct{} // closed when res and err are set
	res      Result
	err      error
	finished time.Time
	waiters  int
	cancel   context.CancelCauseFunc
}

func NewCache(lim Limits) *Cache {
	return &Cache{lim: lim, now: time.Now, entries: map[string]*statsWalk{}, slots: make(chan struct{}, max(lim.MaxConcurrent, 1))}
}

// WalkFunc walks one volume's directory under ctx.
type WalkFunc func(ctx context.Context, lim Limits, visited func(context.Context, int64)) (Result, error)

// usage returns the usage of volume id, published at key, from a fresh
// cached answer, the walk in progress, or a new walk made by walk. It
// returns ctx's error as soon as ctx ends.
func (c *Cache) Usage(ctx context.Context, id string, key Key, walk WalkFunc) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	c.mu.Lock()
	now := c.now()
	c.sweepLocked(now)
	w := c.entries[id]
	if w != nil && (w.key != key || c.expired(w, now)) {
		c.dropLocked(id)
		w = nil
	}
	if w == nil {
		w = c.startLocked(ctx, id, key, walk)
	} else if isDone(w) {
		c.mu.Unlock()
		return w.res, w.err
	}
	w.waiters++
	c.mu.Unlock()

	select {
	case <-w.done:
		c.mu.Lock()
		w.waiters--
		c.mu.Unlock()
		return w.res, w.err
	case <-ctx.Done():
		c.mu.Lock()
		w.waiters--
		if w.waiters == 0 && !isDone(w) {
			w.cancel(errWalkCanceled)
			if c.entries[id] == w {
				delete(c.entries, id)
			}
		}
		c.mu.Unlock()
		return Result{}, ctx.Err()
	}
}

// startLocked starts a walk of volume id. The walk keeps ctx's values (the
// logger) but not its cancellation. It waits for one of the node's
// MaxConcurrent walks first; its Timeout counts from when it has one.
func (c *Cache) startLocked(ctx context.Context, id string, key Key, walk WalkFunc) *statsWalk {
	base, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	w := &statsWalk{key: key, done: make(chan struct{}), cancel: cancel}
	c.entries[id] = w
	c.walks.Add(1)
	c.running.Add(1)
	visited, observe := c.visited, c.Observe
	go func() {
		defer c.running.Done()
		var res Result
		var err error
		start := c.now()
		turn := false
		select {
		case c.slots <- struct{}{}:
			turn = true
		case <-base.Done():
		}
		if base.Err() != nil {
			res.Stopped = boundCanceled // canceled before its turn
		} else {
			wctx, cancelTimeout := context.WithTimeout(base, c.lim.Timeout)
			res, err = walk(wctx, c.lim, visited)
			cancelTimeout()
		}
		if turn {
			<-c.slots
		}
		canceled := errors.Is(context.Cause(base), errWalkCanceled)
		// Counted and logged before the answer is handed out, so that a
		// caller that got it also sees it in the metric.
		if err == nil && res.Stopped != 0 {
			klog.FromContext(ctx).Info("Volume stats walk stopped at a bound: the usage reported is a lower bound",
				logkeys.VolumeID, id, logkeys.Bound, res.Stopped.String(), logkeys.Count, res.Entries,
				logkeys.Duration, c.now().Sub(start))
		}
		if observe != nil && err == nil {
			observe(res.Stopped)
		}
		c.mu.Lock()
		w.res, w.err, w.finished = res, err, c.now()
		if (err != nil || canceled || c.lim.CacheTTL < 0) && c.entries[id] == w {
			delete(c.entries, id) // not reused: the next call walks again
		}
		close(w.done)
		c.mu.Unlock()
		cancel(nil)
	}()
	return w
}

// forget drops volume id's answer, and cancels its walk in progress (whose
// callers get what it counted): the volume is being unpublished, and a walk
// holding its directories open would make the unmount fail with EBUSY.
func (c *Cache) Forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(id)
}

func (c *Cache) dropLocked(id string) {
	if w := c.entries[id]; w != nil {
		if !isDone(w) {
			w.cancel(errWalkCanceled)
		}
		delete(c.entries, id)
	}
}

// expired reports whether w is an answer older than CacheTTL.
func (c *Cache) expired(w *statsWalk, now time.Time) bool {
	return isDone(w) && now.Sub(w.finished) >= c.lim.CacheTTL
}

// sweepLocked drops the answers older than CacheTTL, of volumes nobody asks
// for any more (an answer asked for is checked by itself), at most once per
// CacheTTL: a call does not pay for every volume's entry.
func (c *Cache) sweepLocked(now time.Time) {
	if now.Sub(c.swept) < c.lim.CacheTTL {
		return
	}
	c.swept = now
	for id, w := range c.entries {
		if c.expired(w, now) {
			delete(c.entries, id)
		}
	}
}

// size is the number of volumes with an answer or a walk (tests).
func (c *Cache) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// waiting is the number of callers waiting for volume id's walk (tests).
func (c *Cache) waiting(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.entries[id]; w != nil {
		return w.waiters
	}
	return 0
}

func isDone(w *statsWalk) bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}
