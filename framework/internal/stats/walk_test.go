package stats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"
)

// fakeDir is an in-memory directory for walkTree: the portable logic runs on
// every OS.
type fakeDir struct {
	ents   []walkEntry
	kids   map[string]*fakeDir
	pos    int
	opened *int // directories open, shared by a tree
}

func (d *fakeDir) read(n int) ([]walkEntry, error) {
	if d.pos >= len(d.ents) {
		return nil, io.EOF
	}
	end := min(d.pos+n, len(d.ents))
	out := d.ents[d.pos:end]
	d.pos = end
	return out, nil
}

func (d *fakeDir) open(e walkEntry) (walkDir, error) {
	k := d.kids[e.name]
	if k == nil {
		return nil, errors.New("not a directory")
	}
	*d.opened++
	c := *k
	c.opened = d.opened
	return &c, nil
}

func (d *fakeDir) close() error { *d.opened--; return nil }

// chain is a directory nesting depth levels, each with files files of 1KiB.
func chain(depth, files int, opened *int) *fakeDir {
	var d *fakeDir
	for i := range depth + 1 {
		nd := &fakeDir{kids: map[string]*fakeDir{}, opened: opened}
		for f := range files {
			nd.ents = append(nd.ents, walkEntry{name: fmt.Sprint("f", f), bytes: 1024, dev: 1, ino: uint64(i*1000 + f + 10), links: 1})
		}
		if d != nil {
			nd.ents = append(nd.ents, walkEntry{name: "d", dir: true, bytes: 4096, dev: 1, ino: uint64(i)})
			nd.kids["d"] = d
		}
		d = nd
	}
	*opened++
	return d
}

var rootEntry = walkEntry{dir: true, bytes: 4096, dev: 1, ino: 1}

func TestWalkTreeBounds(t *testing.T) {
	lim := Limits{MaxEntries: 1 << 20, MaxDepth: 8}
	for _, tc := range []struct {
		name          string
		depth, files  int
		lim           Limits
		inodes, bytes int64
		stopped       Bound
		ctx           func() context.Context
	}{
		// root, 5 dirs, 6*2 files.
		{name: "complete", depth: 5, files: 2, lim: lim, inodes: 1 + 5 + 12, bytes: 6*4096 + 12*1024},
		// 4,000 deep: the root, levels 1-8 and the files of the directories
		// listed (levels 0-7); level 8 is counted, not listed.
		{name: "depth", depth: 4000, files: 1, lim: lim, inodes: 1 + 8 + 8, stopped: boundDepth},
		{name: "entries", depth: 10, files: 100, lim: Limits{MaxEntries: 250, MaxDepth: 100}, inodes: 250, stopped: boundEntries},
		{name: "canceled", depth: 10, files: 10, lim: lim, inodes: 1, stopped: boundCanceled, ctx: func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}},
		{name: "timeout", depth: 10, files: 10, lim: lim, inodes: 1, stopped: boundTimeout, ctx: func() context.Context {
			ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
			t.Cleanup(cancel)
			return ctx
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opened, maxOpen int
			root := chain(tc.depth, tc.files, &opened)
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			res := walkTree(ctx, root, rootEntry, tc.lim, func(context.Context, int64) { maxOpen = max(maxOpen, opened) })
			if res.Inodes != tc.inodes || res.Stopped != tc.stopped || (tc.bytes != 0 && res.Bytes != tc.bytes) {
				t.Errorf("walk = %+v, want inodes %d, bytes %d, stopped %v", res, tc.inodes, tc.bytes, tc.stopped)
			}
			if opened != 0 {
				t.Errorf("%d directories left open", opened)
			}
			if maxOpen > tc.lim.MaxDepth {
				t.Errorf("%d directories open at once, want at most MaxDepth %d", maxOpen, tc.lim.MaxDepth)
			}
		})
	}
}

func TestWalkTreeCountsLikeDu(t *testing.T) {
	var opened int
	other := &fakeDir{ents: []walkEntry{{name: "big", bytes: 1 << 30, dev: 2, ino: 5, links: 1}}}
	root := &fakeDir{opened: &opened, kids: map[string]*fakeDir{"mnt": other}, ents: []walkEntry{
		{name: "a", bytes: 1024, dev: 1, ino: 7, links: 2},
		{name: "b", bytes: 1024, dev: 1, ino: 7, links: 2}, // a's hard link
		{name: "link", bytes: 0, dev: 1, ino: 8, links: 1}, // a symlink: never a dir
		{name: "mnt", dir: true, bytes: 4096, dev: 2, ino: 1, links: 2},
	}}
	opened++
	res := walkTree(context.Background(), root, rootEntry, Limits{MaxEntries: 100, MaxDepth: 10}, nil)
	if want := (Result{Bytes: 4096 + 1024, Inodes: 3, Entries: 5}); res != want {
		t.Errorf("walk = %+v, want %+v (a once, the link, nothing of the other filesystem)", res, want)
	}
}

// fakeClock is a settable clock for Cache.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newTestCache(ttl time.Duration) (*Cache, *fakeClock) {
	lim := Limits{CacheTTL: ttl}
	lim = withDefaults(lim)
	c := NewCache(lim)
	clk := &fakeClock{now: time.Unix(1000, 0)}
	c.now = clk.Now
	return c, clk
}

func TestStatsCacheReuseAndExpiry(t *testing.T) {
	c, clk := newTestCache(time.Minute)
	key := Key{Target: "/t", Created: time.Unix(1, 0)}
	n := int64(0)
	walk := func(context.Context, Limits, func(context.Context, int64)) (Result, error) {
		n++
		return Result{Inodes: n}, nil
	}
	get := func(k Key) int64 {
		t.Helper()
		res, err := c.Usage(context.Background(), "v", k, walk)
		if err != nil {
			t.Fatal(err)
		}
		c.running.Wait()
		return res.Inodes
	}
	if got := get(key); got != 1 {
		t.Fatalf("first = %d", got)
	}
	clk.add(59 * time.Second)
	if got := get(key); got != 1 {
		t.Errorf("within the TTL: %d, want the cached 1", got)
	}
	clk.add(time.Second)
	if got := get(key); got != 2 {
		t.Errorf("after the TTL: %d, want a new walk", got)
	}
	// Published again (a new record): walked again at once.
	if got := get(Key{Target: "/t", Created: time.Unix(2, 0)}); got != 3 {
		t.Errorf("new record: %d, want a new walk", got)
	}
	c.Forget("v")
	if c.size() != 0 {
		t.Errorf("forget left %d entries", c.size())
	}
	// Errors are not cached.
	failing := func(context.Context, Limits, func(context.Context, int64)) (Result, error) {
		n++
		return Result{}, errors.New("boom")
	}
	for range 2 {
		if _, err := c.Usage(context.Background(), "v", key, failing); err == nil {
			t.Error("no error")
		}
		c.running.Wait()
	}
	if n != 5 || c.size() != 0 {
		t.Errorf("%d walks, %d cached: an error is walked again and never cached", n, c.size())
	}
	// Expired answers of other volumes are swept.
	get(key)
	clk.add(2 * time.Minute)
	if _, err := c.Usage(context.Background(), "w", key, walk); err != nil {
		t.Fatal(err)
	}
	c.running.Wait()
	if c.size() != 1 {
		t.Errorf("%d entries after the sweep, want 1 (w's)", c.size())
	}
}

// Callers share one walk; a caller that goes away gets its context's error
// at once, the walk goes on for the others, and is canceled (and not cached)
// when the last one has gone.
func TestStatsCacheSingleFlightAndCancel(t *testing.T) {
	c, _ := newTestCache(time.Minute)
	key := Key{Target: "/t"}
	release := make(chan struct{})
	walkCtx := make(chan context.Context, 1)
	walks := 0
	walk := func(ctx context.Context, _ Limits, _ func(context.Context, int64)) (Result, error) {
		walks++
		walkCtx <- ctx
		select {
		case <-release:
			return Result{Inodes: 42}, nil
		case <-ctx.Done():
			return Result{Inodes: 1, Stopped: boundCanceled}, nil
		}
	}
	// Already canceled: nothing starts.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Usage(canceled, "v", key, walk); !errors.Is(err, context.Canceled) || walks != 0 {
		t.Fatalf("canceled caller: %v, %d walks", err, walks)
	}

	const n = 5
	var wg sync.WaitGroup
	results := make([]int64, n)
	for i := range n {
		wg.Go(func() {
			res, err := c.Usage(context.Background(), "v", key, walk)
			if err != nil {
				t.Error(err)
			}
			results[i] = res.Inodes
		})
	}
	leaving, leave := context.WithCancel(context.Background())
	left := make(chan error)
	go func() {
		_, err := c.Usage(leaving, "v", key, walk)
		left <- err
	}()
	for c.waiting("v") < n+1 {
		time.Sleep(time.Millisecond)
	}
	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Errorf("the caller that left got %v, want Canceled", err)
	}
	close(release)
	wg.Wait()
	c.running.Wait()
	for i, r := range results {
		if r != 42 {
			t.Errorf("caller %d got %d, want 42", i, r)
		}
	}
	if walks != 1 {
		t.Errorf("%d walks, want 1", walks)
	}
	<-walkCtx

	// A walk whose only caller leaves is canceled and not cached.
	c.Forget("v")
	release = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := c.Usage(ctx, "v", key, walk)
		done <- err
	}()
	wctx := <-walkCtx
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want Canceled", err)
	}
	<-wctx.Done()
	c.running.Wait()
	if !errors.Is(context.Cause(wctx), errWalkCanceled) || c.size() != 0 {
		t.Errorf("walk context cause %v, %d cached; want errWalkCanceled, nothing cached", context.Cause(wctx), c.size())
	}
}

// A walk remembers at most MaxLinkedFiles files with several links: past
// them it stops, what it counted a lower bound.
func TestWalkTreeBoundsLinkedFiles(t *testing.T) {
	opened := 0
	root := &fakeDir{kids: map[string]*fakeDir{}, opened: &opened}
	for i := range 100 {
		// 50 files, each with two links in this directory.
		root.ents = append(root.ents, walkEntry{name: fmt.Sprint("l", i), bytes: 4096, dev: 1, ino: uint64(100 + i/2), links: 2})
	}
	opened++
	rootEntry := walkEntry{dir: true, bytes: 4096, dev: 1, ino: 1}
	all := walkTree(context.Background(), root, rootEntry, Limits{MaxEntries: 1000, MaxDepth: 10, MaxLinkedFiles: 50}, nil)
	if all.Stopped != 0 || all.Inodes != 51 {
		t.Fatalf("with room for 50 linked files: %+v, want 51 inodes and no bound", all)
	}
	root.pos = 0
	opened = 1
	short := walkTree(context.Background(), root, rootEntry, Limits{MaxEntries: 1000, MaxDepth: 10, MaxLinkedFiles: 10}, nil)
	if short.Stopped != boundLinks || short.Inodes != 11 {
		t.Fatalf("with room for 10 linked files: %+v, want 11 inodes, stopped at %v", short, boundLinks)
	}
	if got := short.Stopped.Names(); len(got) != 1 || got[0] != "max_linked_files" {
		t.Errorf("bound names %v", got)
	}
}

// At most MaxConcurrent walks run at once on the node, whatever the
// volumes; the others wait for a turn, and one whose callers all went away
// never runs.
func TestStatsCacheMaxConcurrent(t *testing.T) {
	lim := Limits{MaxConcurrent: 2}
	lim = withDefaults(lim)
	c := NewCache(lim)
	var mu sync.Mutex
	running, most, walks := 0, 0, 0
	release := make(chan struct{})
	walk := func(ctx context.Context, _ Limits, _ func(context.Context, int64)) (Result, error) {
		mu.Lock()
		running++
		walks++
		most = max(most, running)
		mu.Unlock()
		<-release
		mu.Lock()
		running--
		mu.Unlock()
		return Result{Inodes: 1}, nil
	}
	key := Key{Target: "/t"}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if _, err := c.Usage(context.Background(), fmt.Sprint("v", i), key, walk); err != nil {
				t.Errorf("v%d: %v", i, err)
			}
		})
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := running
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d walks running, want 2", n)
		}
	}
	// A fifth volume's caller gives up before its turn.
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := c.Usage(ctx, "v-gone", key, walk)
		gone <- err
	}()
	for c.waiting("v-gone") == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that went away got %v", err)
	}
	close(release)
	wg.Wait()
	c.running.Wait()
	if most != 2 || walks != 4 {
		t.Errorf("%d walks at most at once, %d in all; want 2 and 4 (the abandoned one never runs)", most, walks)
	}
}

// withDefaults fills l's zero fields as framework.StatsWalkLimits does.
func withDefaults(l Limits) Limits {
	if l.MaxEntries == 0 {
		l.MaxEntries = 1_000_000
	}
	if l.MaxDepth == 0 {
		l.MaxDepth = 128
	}
	if l.Timeout == 0 {
		l.Timeout = 5 * time.Second
	}
	if l.MaxConcurrent == 0 {
		l.MaxConcurrent = 4
	}
	if l.MaxLinkedFiles == 0 {
		l.MaxLinkedFiles = 1 << 16
	}
	if l.CacheTTL == 0 {
		l.CacheTTL = time.Minute
	}
	return l
}
