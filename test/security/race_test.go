//go:build linux

package security

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// raceIterations is how many publish/unpublish cycles each component's race
// runs; EPHEMERA_RACE_ITERATIONS raises it.
func raceIterations() int { return iterations("EPHEMERA_RACE_ITERATIONS", 250) }

// iterations is the positive integer in the environment variable name, else def.
func iterations(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// attacker swaps one path component below the kubelet root, as fast as it
// can, with something leading outside the root (renameat2 RENAME_EXCHANGE
// with a symbolic link to a twin tree outside, or with a real directory
// outside the root on the same filesystem). Each swap and its undo happen
// under mu, so a checker holding mu sees the canonical tree: these races test
// that nothing outside the root is touched. Whether an OK is true of the
// tree the kubelet then sees, with an attacker that never puts back, is
// TestPublishOKOnlyAtTheTarget's.
type attacker struct {
	mu     sync.Mutex
	swaps  atomic.Int64
	busy   atomic.Int64 // undo attempts that met a mount made on the swapped directory
	err    atomic.Pointer[error]
	stop   chan struct{}
	done   chan struct{}
	path   string // the component in the root
	decoy  string // what is exchanged with it
	absent bool   // path may not exist (the target itself): plant the decoy instead
	moves  bool   // the decoy is a real directory: the target's directory moves away
}

func (a *attacker) run() {
	defer close(a.done)
	for {
		select {
		case <-a.stop:
			return
		default:
		}
		a.mu.Lock()
		err := unix.Renameat2(unix.AT_FDCWD, a.path, unix.AT_FDCWD, a.decoy, unix.RENAME_EXCHANGE)
		if err == nil {
			a.swaps.Add(1)
			runtime.Gosched()
			// A directory mounted on meanwhile cannot be renamed (EBUSY) until
			// the driver takes the stray mount down again.
			for try := 0; ; try++ {
				err := unix.Renameat2(unix.AT_FDCWD, a.path, unix.AT_FDCWD, a.decoy, unix.RENAME_EXCHANGE)
				if err == nil {
					break
				}
				if !errors.Is(err, unix.EBUSY) || try == 5000 {
					a.fail(fmt.Errorf("undoing a swap of %s: %w (the driver removed or replaced what was swapped in)", a.path, err))
					a.mu.Unlock()
					return
				}
				a.busy.Add(1)
				time.Sleep(100 * time.Microsecond)
			}
		} else if errors.Is(err, unix.ENOENT) && a.absent {
			// The target does not exist: plant the decoy there and take it back.
			if unix.Renameat2(unix.AT_FDCWD, a.decoy, unix.AT_FDCWD, a.path, unix.RENAME_NOREPLACE) == nil {
				a.swaps.Add(1)
				runtime.Gosched()
				if err := unix.Renameat2(unix.AT_FDCWD, a.path, unix.AT_FDCWD, a.decoy, unix.RENAME_NOREPLACE); err != nil {
					a.fail(fmt.Errorf("taking back the link planted at %s: %w (the driver removed it)", a.path, err))
					a.mu.Unlock()
					return
				}
			}
		}
		a.mu.Unlock()
	}
}

func (a *attacker) fail(err error) { a.err.CompareAndSwap(nil, &err) }

// checkWith returns the attacker's own failure, else check's (when set).
func (a *attacker) checkWith(check func() error) error {
	if err := a.err.Load(); err != nil {
		return *err
	}
	if check != nil {
		return check()
	}
	return nil
}

func (a *attacker) start() { a.stop, a.done = make(chan struct{}), make(chan struct{}); go a.run() }
func (a *attacker) halt()  { close(a.stop); <-a.done }

// TestSymlinkRaceNeverEscapesRoot: while another process swaps a component of
// the target's path (each in turn) for a symbolic link leading outside the
// kubelet root, tens of thousands of times, NodePublishVolume and
// NodeUnpublishVolume never mount, unmount or remount anything outside the
// root, and answer OK only when the volume is mounted at its target (publish)
// or gone from it (unpublish).
func TestSymlinkRaceNeverEscapesRoot(t *testing.T) {
	comps := []string{"pods", "<uid>", "volumes", "kubernetes.io~csi", "v", "mount"}
	for i := range comps {
		t.Run(comps[i], func(t *testing.T) {
			n := newNode(t, nil)
			pod := n.h.Kubelet.NewPod("default", "app")
			rel := []string{"pods", pod.UID, "volumes", "kubernetes.io~csi", "v", "mount"}
			target := filepath.Join(append([]string{n.root}, rel...)...)
			if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
				t.Fatal(err)
			}
			// The twin outside, with a mount holding data where the target
			// would be: what a followed link would reach.
			twin := filepath.Join(append([]string{n.outside}, rel...)...)
			if err := os.MkdirAll(twin, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("sentinel", twin, "tmpfs", 0, "size=64k"); err != nil {
				t.Fatal(err)
			}
			n.write(twin, "precious", "outside")
			comp := filepath.Join(append([]string{n.root}, rel[:i+1]...)...)
			decoy := comp + ".evil"
			if err := os.Symlink(filepath.Join(append([]string{n.outside}, rel[:i+1]...)...), decoy); err != nil {
				t.Fatal(err)
			}
			a := &attacker{path: comp, decoy: decoy, absent: i == len(comps)-1}
			raceVolume(t, n, pod, target, a, func() error {
				if m := mountsBelow(t, n.outside); len(m) != 1 || m[0].MountPoint != twin {
					return fmt.Errorf("mounts outside the kubelet root: %+v, want only the sentinel", m)
				}
				if b, err := os.ReadFile(filepath.Join(twin, "precious")); err != nil || string(b) != "outside" {
					return fmt.Errorf("data outside the root: %q, %v", b, err)
				}
				if err := os.WriteFile(filepath.Join(twin, "rw"), nil, 0o644); err != nil {
					return fmt.Errorf("the mount outside was remounted read-only: %v", err)
				}
				return nil
			})
			if err := unix.Unmount(twin, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRenameRaceLeavesNoStrayMount: while another process exchanges the
// volume's directory (…/kubernetes.io~csi/v, which holds the target) with a
// real directory outside the kubelet root on the same filesystem, a mount that
// the rename carried away before the driver verified it is detected and
// removed: no publish leaves a mount it did not answer OK for, anywhere, and
// a mount an exchange brought back to the target is adopted by the next
// publish, never stacked on. (A volume answered OK moves with its directory
// when someone renames that directory afterwards: rename(2) cannot be
// refused. Doing so needs write access inside the kubelet root and outside
// it, as root on the node has.)
func TestRenameRaceLeavesNoStrayMount(t *testing.T) {
	n := newNode(t, nil)
	pod := n.h.Kubelet.NewPod("default", "app")
	target := n.h.Kubelet.TargetPath(pod, "v")
	volDir := filepath.Dir(target)
	if err := os.MkdirAll(volDir, 0o750); err != nil {
		t.Fatal(err)
	}
	decoy := filepath.Join(n.outside, "v")
	if err := os.MkdirAll(filepath.Join(decoy, "mount"), 0o750); err != nil {
		t.Fatal(err)
	}
	a := &attacker{path: volDir, decoy: decoy, moves: true}
	raceVolume(t, n, pod, target, a, nil)
}

// raceVolume publishes and unpublishes pod's volume "v" through the driver
// while a attacks, checking after each call (with the tree canonical) that the
// answer matches what is mounted at target, that no call leaves a mount of
// the volume's tmpfs it did not answer OK for (a publish adds at most one, and
// only when it answers OK; an unpublish adds none), and that check (when set)
// passes.
func raceVolume(t *testing.T, n *node, pod *drivertest.Pod, target string, a *attacker, check func() error) {
	t.Helper()
	req := n.h.Kubelet.PublishRequest(pod, drivertest.InlineVolume{Name: "v", Attributes: attrs["tmpfs"]})
	unreq := &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath}
	outcomes := map[string]int{}
	a.start()
	defer func() {
		if a.done != nil {
			select {
			case <-a.done:
			default:
				a.halt()
			}
		}
	}()
	iters := raceIterations()
	live := false  // the driver answered OK for a publish not followed by an OK unpublish
	stray := false // a mount the driver has no record of is at the target (see below)
	for i := range iters {
		a.mu.Lock()
		before := ourMounts(t, n.base)
		a.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, perr := n.h.Node.NodePublishVolume(ctx, req)
		a.mu.Lock()
		if after := ourMounts(t, n.base); after > before+1 || (perr != nil && after > before) {
			a.mu.Unlock()
			t.Fatalf("iteration %d: NodePublishVolume (%v) left %d mounts of the volume's tmpfs, %d before: a stray mount", i, perr, after, before)
		}
		outcomes["publish "+status.Code(perr).String()]++
		mounted := isMountPoint(target)
		switch {
		case perr == nil && !mounted && a.moves:
			// Verified at the target, then carried away by a rename after
			// the verification (see TestRenameRaceLeavesNoStrayMount).
			outcomes["publish OK, moved away after it was verified"]++
		case perr == nil && !mounted:
			a.mu.Unlock()
			t.Fatalf("iteration %d: NodePublishVolume answered OK, but nothing is mounted at %s", i, target)
		case perr != nil && mounted && !live && !stray:
			a.mu.Unlock()
			t.Fatalf("iteration %d: a first NodePublishVolume failed (%v) and left a mount at %s", i, perr, target)
		case perr != nil && !allowedRaceCode(status.Code(perr)):
			a.mu.Unlock()
			t.Fatalf("iteration %d: NodePublishVolume: %v", i, perr)
		}
		if perr == nil {
			live, stray = true, false
		}
		if mounted {
			if m := n.mountsAt(target); len(m) != 1 || m[0].FSType != "tmpfs" || m[0].Source != "ephemera-tmpfs" {
				a.mu.Unlock()
				t.Fatalf("iteration %d: mounts at %s: %+v, want exactly the volume's tmpfs", i, target, m)
			}
		}
		if err := a.checkWith(check); err != nil {
			a.mu.Unlock()
			t.Fatalf("iteration %d: %v", i, err)
		}
		before = ourMounts(t, n.base)
		a.mu.Unlock()
		_, uerr := n.h.Node.NodeUnpublishVolume(ctx, unreq)
		cancel()
		a.mu.Lock()
		if after := ourMounts(t, n.base); after > before {
			a.mu.Unlock()
			t.Fatalf("iteration %d: NodeUnpublishVolume (%v) added a mount", i, uerr)
		}
		outcomes["unpublish "+status.Code(uerr).String()]++
		if uerr == nil {
			live, stray = false, false
			if isMountPoint(target) {
				if !a.moves {
					a.mu.Unlock()
					t.Fatalf("iteration %d: NodeUnpublishVolume answered OK, but %s is still mounted", i, target)
				}
				// The rename carried the real target away during the call and
				// back after it: the driver saw (and cleaned) the decoy. The
				// next publish must adopt this mount, never stack on it.
				outcomes["unpublish OK, carried-away mount back at the target"]++
				stray = true
			}
		}
		if uerr != nil && !allowedRaceCode(status.Code(uerr)) {
			a.mu.Unlock()
			t.Fatalf("iteration %d: NodeUnpublishVolume: %v", i, uerr)
		}
		if err := a.checkWith(check); err != nil {
			a.mu.Unlock()
			t.Fatalf("iteration %d: %v", i, err)
		}
		a.mu.Unlock()
	}
	a.halt()
	// Without the attacker, the volume publishes and unpublishes cleanly.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := n.h.Node.NodeUnpublishVolume(ctx, unreq); err != nil {
		t.Fatalf("final unpublish: %v", err)
	}
	if isMountPoint(target) || len(mountsBelow(t, n.root)) != 0 {
		t.Fatalf("mounts left below the root: %+v", mountsBelow(t, n.root))
	}
	t.Logf("%d swaps during %d publish/unpublish cycles (%d undo attempts met a stray mount); outcomes %v", a.swaps.Load(), iters, a.busy.Load(), outcomes)
	if a.swaps.Load() < int64(iters) {
		t.Errorf("the attacker swapped only %d times in %d cycles: the race did not run", a.swaps.Load(), iters)
	}
}

// allowedRaceCode: what a publish or unpublish that met a swapped path may
// answer. InvalidArgument: a link in the path; Aborted: the target moved or
// changed during the call (the kubelet retries); NotFound/Unavailable: a
// directory missing at that moment.
func allowedRaceCode(c codes.Code) bool {
	switch c {
	case codes.InvalidArgument, codes.Aborted, codes.Unavailable, codes.NotFound:
		return true
	}
	return false
}

// ourMounts counts the mounts of Ephemera's tmpfs below dir.
func ourMounts(t *testing.T, dir string) int {
	count := 0
	for _, mi := range mountsBelow(t, dir) {
		if mi.Source == "ephemera-tmpfs" {
			count++
		}
	}
	return count
}

func mountsBelow(t *testing.T, dir string) []mount.MountInfo {
	t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	return mount.MountsUnder(infos, dir)
}
