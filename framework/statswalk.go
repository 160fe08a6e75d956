package framework

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
)

// StatsWalkLimits bound the walk that NodeGetVolumeStats makes of a directory
// volume (the dir backend, a plugin's directory source): its usage is counted
// like du, entry by entry, and the pod decides how many entries there are and
// how deep they nest. A walk that reaches a bound stops there and the answer
// is what it counted, a lower bound (logged and counted in
// ephemera_stats_walks_total; the volume is not reported abnormal). Zero
// fields take the defaults.
type StatsWalkLimits struct {
	// MaxEntries caps the entries (files, directories, links) one walk
	// visits. Defaults to 1,000,000.
	MaxEntries int64
	// MaxDepth caps how deep below the volume's root a walk goes: entries
	// nested deeper are not counted. It also bounds the directories a walk
	// holds open. Defaults to 128.
	MaxDepth int
	// Timeout caps one walk's wall time, whoever waits for it (the walk runs
	// under its own deadline, not the caller's). Defaults to 5s, well under
	// the kubelet's stats deadline; at most 1m.
	Timeout time.Duration
	// MaxConcurrent caps the walks in progress on the node, whatever the
	// volumes: a walk waits for one of them before it starts (its Timeout
	// counts from then), and a caller that goes away stops waiting. Each walk
	// holds up to about statsWalkMemory of memory, so that the walks of a
	// node are a fixed part of the driver's memory plan whatever the pods
	// put in their directories and however many cores walk them. Defaults
	// to 4.
	MaxConcurrent int
	// MaxLinkedFiles caps the files with several hard links one walk
	// remembers (to count each once, like du): past it the walk stops, its
	// answer a lower bound. It bounds the memory of a walk (about 40 bytes
	// each). Defaults to 65,536.
	MaxLinkedFiles int
	// CacheTTL is how long a walk's answer is reused for the same volume
	// (concurrent calls always share one walk). The kubelet asks once a
	// minute per volume, so a pod's directory costs at most one Timeout of
	// walking per CacheTTL. Defaults to 1m; negative: answers are not reused.
	CacheTTL time.Duration
}

// Defaults of StatsWalkLimits, shared by setDefaults and BindFlags.
const (
	defaultStatsMaxEntries = 1_000_000
	defaultStatsMaxDepth   = 128
	defaultStatsTimeout    = 5 * time.Second
	defaultStatsCacheTTL   = time.Minute
	maxStatsTimeout        = time.Minute
	defaultStatsWalks      = 4
	defaultStatsLinked     = 1 << 16
	// statsWalkMemory is what one walk may hold at most, for the memory
	// plan: its remembered links (MaxLinkedFiles of about 40 bytes, with
	// the map's growth), the batches of entries of MaxDepth open
	// directories (walkBatch each), and the garbage of both. Measured by
	// test/bench TestDriverContentMemory's walk rows.
	statsWalkMemory = 8 << 20
)

func (l *StatsWalkLimits) setDefaults() {
	if l.MaxEntries == 0 {
		l.MaxEntries = defaultStatsMaxEntries
	}
	if l.MaxDepth == 0 {
		l.MaxDepth = defaultStatsMaxDepth
	}
	if l.Timeout == 0 {
		l.Timeout = defaultStatsTimeout
	}
	if l.CacheTTL == 0 {
		l.CacheTTL = defaultStatsCacheTTL
	}
	if l.MaxConcurrent == 0 {
		l.MaxConcurrent = defaultStatsWalks
	}
	if l.MaxLinkedFiles == 0 {
		l.MaxLinkedFiles = defaultStatsLinked
	}
}

func (l StatsWalkLimits) validate() error {
	var errs []error
	if l.MaxEntries < 0 || l.MaxDepth < 0 {
		errs = append(errs, fmt.Errorf("Limits.StatsWalk.MaxEntries %d and Limits.StatsWalk.MaxDepth %d must not be negative", l.MaxEntries, l.MaxDepth))
	}
	if l.MaxConcurrent < 0 || l.MaxLinkedFiles < 0 {
		errs = append(errs, fmt.Errorf("Limits.StatsWalk.MaxConcurrent %d (--stats-max-walks) and Limits.StatsWalk.MaxLinkedFiles %d (--stats-max-linked-files) must not be negative", l.MaxConcurrent, l.MaxLinkedFiles))
	}
	if l.Timeout < 0 || l.Timeout > maxStatsTimeout {
		errs = append(errs, fmt.Errorf("Limits.StatsWalk.Timeout %s must be positive and at most %s", l.Timeout, maxStatsTimeout))
	}
	return errors.Join(errs...)
}

// walkBound says which bounds stopped a walk short (a bit set).
type walkBound uint8

const (
	boundEntries  walkBound = 1 << iota // MaxEntries reached
	boundDepth                          // a directory at MaxDepth was not listed
	boundTimeout                        // Timeout reached
	boundCanceled                       // every caller went away, or the volume was unpublished
	boundLinks                          // MaxLinkedFiles reached
)

// boundNames are the values of the result label of ephemera_stats_walks_total.
var boundNames = []struct {
	b    walkBound
	name string
}{
	{boundEntries, metrics.StatsWalkMaxEntries},
	{boundDepth, metrics.StatsWalkMaxDepth},
	{boundTimeout, metrics.StatsWalkTimeout},
	{boundCanceled, metrics.StatsWalkCanceled},
	{boundLinks, metrics.StatsWalkMaxLinkedFiles},
}

// names lists the bounds in b, or StatsWalkComplete for none.
func (b walkBound) names() []string {
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

func (b walkBound) String() string { return strings.Join(b.names(), ",") }

// walkResult is what a walk counted: a lower bound when stopped is not 0.
type walkResult struct {
	bytes, inodes int64
	entries       int64 // entries visited, the root included
	stopped       walkBound
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
func walkTree(ctx context.Context, root walkDir, self walkEntry, lim StatsWalkLimits, visited func(context.Context, int64)) walkResult {
	res := walkResult{bytes: max(self.bytes, 0), inodes: 1, entries: 1}
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
				res.stopped |= boundTimeout
			} else {
				res.stopped |= boundCanceled
			}
			return res
		}
		if res.entries >= lim.MaxEntries {
			res.stopped |= boundEntries
			return res
		}
		res.entries++
		if visited != nil {
			visited(ctx, res.entries)
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
				res.stopped |= boundLinks
				return res
			}
			seen[id] = struct{}{}
		}
		res.inodes++
		res.bytes = addSat(res.bytes, e.bytes)
		if !e.dir {
			continue
		}
		if len(stack) >= lim.MaxDepth { // e is at depth len(stack)
			res.stopped |= boundDepth
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

// statsCache shares the walks of directory volumes: concurrent calls for one
// volume wait for one walk, and its answer is reused for CacheTTL. A walk runs
// under its own deadline (Timeout), detached from its callers, each of whom
// waits with its own context; when the last of them has gone the walk is
// canceled and its answer dropped, so a canceled caller never leaves a short
// count for the others. Entries are keyed by volume ID and checked against the
// record's target and creation time, dropped on unpublish (forget) and swept
// once expired.
type statsCache struct {
	lim StatsWalkLimits
	now func() time.Time

	mu    sync.Mutex
	swept time.Time // the last sweep of expired answers
	// observe, when set, is told how every walk that did not fail ended
	// (the metric). Under mu.
	observe func(walkBound)
	entries map[string]*statsWalk
	// slots are the node's walks in progress (MaxConcurrent): a walk sends
	// before it starts and receives when it ends.
	slots chan struct{}

	// Tests.
	walks   atomic.Int64                 // walks started
	running sync.WaitGroup               // walks in progress
	visited func(context.Context, int64) // under mu: called per entry of every walk
}

// statsKey identifies one publication of a volume: a volume unpublished and
// published again (the same ID) has a new record.
type statsKey struct {
	target  string
	created time.Time
}

// statsWalk is one walk of one volume, in progress or done.
type statsWalk struct {
	key      statsKey
	done     chan struct{} // closed when res and err are set
	res      walkResult
	err      error
	finished time.Time
	waiters  int
	cancel   context.CancelCauseFunc
}

func newStatsCache(lim StatsWalkLimits) *statsCache {
	return &statsCache{lim: lim, now: time.Now, entries: map[string]*statsWalk{}, slots: make(chan struct{}, max(lim.MaxConcurrent, 1))}
}

// walkFunc walks one volume's directory under ctx.
type walkFunc func(ctx context.Context, lim StatsWalkLimits, visited func(context.Context, int64)) (walkResult, error)

// usage returns the usage of volume id, published at key, from a fresh
// cached answer, the walk in progress, or a new walk made by walk. It
// returns ctx's error as soon as ctx ends.
func (c *statsCache) usage(ctx context.Context, id string, key statsKey, walk walkFunc) (walkResult, error) {
	if err := ctx.Err(); err != nil {
		return walkResult{}, err
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
		return walkResult{}, ctx.Err()
	}
}

// startLocked starts a walk of volume id. The walk keeps ctx's values (the
// logger) but not its cancellation. It waits for one of the node's
// MaxConcurrent walks first; its Timeout counts from when it has one.
func (c *statsCache) startLocked(ctx context.Context, id string, key statsKey, walk walkFunc) *statsWalk {
	base, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	w := &statsWalk{key: key, done: make(chan struct{}), cancel: cancel}
	c.entries[id] = w
	c.walks.Add(1)
	c.running.Add(1)
	visited, observe := c.visited, c.observe
	go func() {
		defer c.running.Done()
		var res walkResult
		var err error
		start := c.now()
		turn := false
		select {
		case c.slots <- struct{}{}:
			turn = true
		case <-base.Done():
		}
		if base.Err() != nil {
			res.stopped = boundCanceled // canceled before its turn
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
		if err == nil && res.stopped != 0 {
			klog.FromContext(ctx).Info("Volume stats walk stopped at a bound: the usage reported is a lower bound",
				logkeys.VolumeID, id, logkeys.Bound, res.stopped.String(), logkeys.Count, res.entries,
				logkeys.Duration, c.now().Sub(start))
		}
		if observe != nil && err == nil {
			observe(res.stopped)
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
func (c *statsCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(id)
}

func (c *statsCache) dropLocked(id string) {
	if w := c.entries[id]; w != nil {
		if !isDone(w) {
			w.cancel(errWalkCanceled)
		}
		delete(c.entries, id)
	}
}

// expired reports whether w is an answer older than CacheTTL.
func (c *statsCache) expired(w *statsWalk, now time.Time) bool {
	return isDone(w) && now.Sub(w.finished) >= c.lim.CacheTTL
}

// sweepLocked drops the answers older than CacheTTL, of volumes nobody asks
// for any more (an answer asked for is checked by itself), at most once per
// CacheTTL: a call does not pay for every volume's entry.
func (c *statsCache) sweepLocked(now time.Time) {
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
func (c *statsCache) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// waiting is the number of callers waiting for volume id's walk (tests).
func (c *statsCache) waiting(id string) int {
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
