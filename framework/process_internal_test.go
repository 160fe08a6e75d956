package framework

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/daemon"
	"github.com/ephemera-csi/ephemera/framework/internal/exepages"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// runNode is the NodeOptions of a driver a test runs: its socket in a
// directory of its own in the system's temporary directory (a path below
// t.TempDir can be too long for a UNIX socket), removed at cleanup, and its
// kubelet root and state below t.TempDir.
func runNode(t *testing.T, sockPrefix string) NodeOptions {
	t.Helper()
	sockDir, err := os.MkdirTemp("", sockPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	root := t.TempDir()
	return NodeOptions{
		ID:             "n",
		Endpoint:       "unix://" + filepath.Join(sockDir, "csi.sock"),
		KubeletRootDir: filepath.Join(root, "kubelet"),
		StateDir:       filepath.Join(root, "state"),
	}
}

// runUntilReady runs a driver with limits until it is ready, then stops it.
// created runs before Run, during while the driver is ready.
func runUntilReady(t *testing.T, limits LimitOptions, created func(d *Driver), during func()) {
	t.Helper()
	d, err := New(Options{
		DriverName: "process.csi.ephemera.dev",
		Backends:   map[string]Backend{"b": BackendFuncs{}},
		Node:       runNode(t, "ephemera-process"),
		Limits:     limits,
		State:      StateOptions{Store: memstore.New()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if created != nil {
		created(d)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !d.ready.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !d.ready.Load() {
		cancel()
		<-done
		t.Fatal("driver not ready after 10s")
	}
	if during != nil {
		during()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// Run releases the binary's startup pages before it says it is ready, unless
// Options.Limits.KeepBinaryPages; a platform that cannot does not stop it.
func TestRunReleasesBinaryPages(t *testing.T) {
	for _, tc := range []struct {
		name  string
		keep  bool
		err   error
		calls int32
	}{
		{name: "default", calls: 1},
		{name: "kept", keep: true, calls: 0},
		{name: "unsupported", err: exepages.ErrUnsupported, calls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				calls      atomic.Int32
				readyFirst atomic.Bool
				d          *Driver
			)
			old := daemon.ReleaseBinaryPages
			daemon.ReleaseBinaryPages = func() (exepages.Result, error) {
				calls.Add(1)
				readyFirst.Store(d.ready.Load())
				return exepages.Result{Mappings: 2, ResidentBefore: 15 << 20, ResidentAfter: 1 << 20}, tc.err
			}
			t.Cleanup(func() { daemon.ReleaseBinaryPages = old })
			runUntilReady(t, LimitOptions{KeepBinaryPages: tc.keep}, func(dr *Driver) { d = dr }, nil)
			if got := calls.Load(); got != tc.calls {
				t.Errorf("binary pages released %d times, want %d", got, tc.calls)
			}
			if readyFirst.Load() {
				t.Error("binary pages released after the driver said it was ready")
			}
		})
	}
}

// Run sets Go's memory limit from Limits.MemoryLimit while it runs, and
// puts the previous one back; GOMEMLIMIT, when set, wins.
func TestRunSetsGoMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int64
		env       string
		wantWhile int64 // the limit set while running; -1: none set
	}{
		{name: "unset", limit: 0, wantWhile: -1},
		{name: "256Mi", limit: 256 << 20, wantWhile: 192 << 20},
		{name: "64Mi", limit: 64 << 20, wantWhile: 32 << 20},
		{name: "GOMEMLIMIT wins", limit: 256 << 20, env: "100MiB", wantWhile: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("GOMEMLIMIT", tc.env)
			}
			const before = int64(1) << 62
			current := before
			var set []int64
			old := daemon.SetMemoryLimit
			daemon.SetMemoryLimit = func(n int64) int64 {
				prev := current
				current = n
				set = append(set, n)
				return prev
			}
			t.Cleanup(func() { daemon.SetMemoryLimit = old })
			var while int64 = -1
			runUntilReady(t, LimitOptions{MemoryLimit: tc.limit}, nil, func() {
				if len(set) > 0 {
					while = current
				}
			})
			if while != tc.wantWhile {
				t.Errorf("Go's memory limit while running: %d, want %d (set: %v)", while, tc.wantWhile, set)
			}
			if current != before {
				t.Errorf("Go's memory limit after Run: %d, want the one before, %d", current, before)
			}
		})
	}
}

func TestGoMemoryLimit(t *testing.T) {
	for limit, want := range map[int64]int64{
		1 << 30:   768 << 20,
		256 << 20: 192 << 20,
		100 << 20: 68 << 20,
		64 << 20:  32 << 20,
		32 << 20:  0,
	} {
		if got := GoMemoryLimit(limit); got != want {
			t.Errorf("GoMemoryLimit(%d MiB) = %d MiB, want %d MiB", limit>>20, got>>20, want>>20)
		}
	}
	for _, bad := range []int64{-1, 32 << 20, 1 << 20} {
		_, err := New(Options{DriverName: "x.csi.ephemera.dev", Backends: map[string]Backend{"b": BackendFuncs{}},
			Node: NodeOptions{ID: "n"}, Limits: LimitOptions{MemoryLimit: bad}, State: StateOptions{Store: memstore.New()}})
		if err == nil {
			t.Errorf("New with Limits.MemoryLimit %d: no error", bad)
		}
	}
}

// The memory plan of the defaults: the DaemonSet's 320Mi holds it, the
// 256Mi of before does not (the content capacity came on top), and Go's
// soft limit, which leaves the content capacity out, still holds the
// answers in flight and the walks at their peak.
func TestMemoryNeeded(t *testing.T) {
	need := MemoryNeeded(DefaultContentBytesInFlight, DefaultContentCapacity, defaultStatsWalks)
	if need <= 256<<20 || need > 320<<20 {
		t.Errorf("MemoryNeeded of the defaults = %s, want more than 256Mi and at most the DaemonSet's 320Mi", words.Bytes(need))
	}
	goNeeds := 3*DefaultContentBytesInFlight + defaultStatsWalks*stats.WalkMemory
	if got := GoMemoryLimit(need - DefaultContentCapacity); got < goNeeds {
		t.Errorf("Go's soft limit at the plan's limit = %s, less than the %s it must hold", words.Bytes(got), words.Bytes(goNeeds))
	}
	if got := GoMemoryLimit(need - 1<<20 - DefaultContentCapacity); got >= goNeeds && need-1<<20 >= DefaultContentCapacity+goNeeds+daemon.GoReserve {
		t.Errorf("MemoryNeeded is not the least limit: 1Mi less still holds the plan")
	}
	if MemoryNeeded(DefaultContentBytesInFlight, NoContentCapacity, 4) != -1 {
		t.Error("an unbounded content capacity fits a limit")
	}
}
