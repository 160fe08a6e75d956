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
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// verdictIterations is how many fresh volumes each mode of
// TestPublishOKOnlyAtTheTarget publishes under attack. The break it guards
// against needed 200 to 2,300 publishes on these machines (four runs of
// 9bf726c); EPHEMERA_VERDICT_ITERATIONS sets it (10,000 on demand).
func verdictIterations() int { return iterations("EPHEMERA_VERDICT_ITERATIONS", 2500) }

// toggler exchanges path with decoy (renameat2 RENAME_EXCHANGE) in a tight
// loop on a thread of its own, without ever putting anything back on its
// own: whatever the driver resolves, checks or mounts, the tree may be either
// way round a moment later. Nothing is synchronised with the driver or with
// the test's checks.
type toggler struct {
	path, decoy string
	swaps       atomic.Int64
	stop        atomic.Bool
	done        chan struct{}
}

func startToggler(path, decoy string) *toggler {
	tg := &toggler{path: path, decoy: decoy, done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		defer close(tg.done)
		for !tg.stop.Load() {
			// ENOENT until the driver made the target; EBUSY once a mount
			// sits on the directory: both are just tries that did nothing.
			if unix.Renameat2(unix.AT_FDCWD, tg.path, unix.AT_FDCWD, tg.decoy, unix.RENAME_EXCHANGE) == nil {
				tg.swaps.Add(1)
			}
		}
	}()
	return tg
}

// halt stops the toggler and waits until its last exchange has returned.
func (tg *toggler) halt() { tg.stop.Store(true); <-tg.done }

// restore puts the real directory back at path when the last exchange left
// the link there and the directory can still be moved (a mount point cannot).
func (tg *toggler) restore() error {
	var st unix.Stat_t
	if err := unix.Lstat(tg.path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return nil
	}
	err := unix.Renameat2(unix.AT_FDCWD, tg.path, unix.AT_FDCWD, tg.decoy, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.EBUSY) {
		return nil // the real directory is a mount point now: it stays where it is
	}
	return err
}

// TestPublishOKOnlyAtTheTarget: while a racer keeps exchanging a directory of
// the target's path with a symbolic link leading outside the kubelet root,
// never undoing a swap on its own, a publish of a fresh volume answers OK only
// when, once the racer has stopped (and put the real directory back where it
// still can), the target — looked up by its names, no link followed — is the
// volume's one mount; a publish that fails leaves no mount of the volume
// anywhere. Two modes: the target directory ("mount") exchanged with a link
// (the driver creates it, so the racer starts on it as soon as it exists),
// and the volume's directory (".../kubernetes.io~csi/<vol>", which the
// kubelet creates) exchanged with one. The verdict is taken from the final
// state by names: that is what the kubelet binds into the container.
func TestPublishOKOnlyAtTheTarget(t *testing.T) {
	for _, mode := range []string{"mount", "volume-dir"} {
		t.Run(mode, func(t *testing.T) {
			n := newNode(t, nil)
			iters := verdictIterations()
			outcomes := map[string]int{}
			var swaps int64
			for i := range iters {
				pod := n.h.Kubelet.NewPod("default", fmt.Sprintf("app-%d", i))
				target := n.h.Kubelet.TargetPath(pod, "v")
				volDir := filepath.Dir(target)
				if err := os.MkdirAll(volDir, 0o750); err != nil {
					t.Fatal(err)
				}
				// What a followed link would reach: a twin of the path outside
				// the root, its target directory ready to be mounted on.
				comp := target
				if mode == "volume-dir" {
					comp = volDir
				}
				twin := filepath.Join(n.outside, strconv.Itoa(i), filepath.Base(comp))
				if err := os.MkdirAll(filepath.Join(twin, "mount"), 0o755); err != nil {
					t.Fatal(err)
				}
				decoy := comp + ".evil"
				if err := os.Symlink(twin, decoy); err != nil {
					t.Fatal(err)
				}
				req := n.h.Kubelet.PublishRequest(pod, drivertest.InlineVolume{Name: "v", Attributes: attrs["tmpfs"]})
				tg := startToggler(comp, decoy)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, perr := n.h.Node.NodePublishVolume(ctx, req)
				tg.halt()
				swaps += tg.swaps.Load()
				if err := tg.restore(); err != nil {
					cancel()
					t.Fatalf("iteration %d: putting the real directory back: %v", i, err)
				}
				if err := verdict(t, n, target, perr == nil); err != nil {
					cancel()
					t.Fatalf("iteration %d (%d swaps): NodePublishVolume answered %v: %v", i, tg.swaps.Load(), status.Code(perr), err)
				}
				if perr != nil && !allowedRaceCode(status.Code(perr)) {
					cancel()
					t.Fatalf("iteration %d: NodePublishVolume: %v", i, perr)
				}
				outcomes["publish "+status.Code(perr).String()]++
				// The kubelet's unpublish, with nothing racing: OK, and the
				// volume gone.
				_, uerr := n.h.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath})
				cancel()
				if uerr != nil {
					t.Fatalf("iteration %d: NodeUnpublishVolume after the race: %v", i, uerr)
				}
				if m := ourMounts(t, n.base); m != 0 {
					t.Fatalf("iteration %d: %d mounts of the volume's tmpfs left after the unpublish: %+v", i, m, mountsBelow(t, n.base))
				}
				if err := os.RemoveAll(filepath.Join(n.root, "pods", pod.UID)); err != nil {
					t.Fatal(err)
				}
				if err := os.RemoveAll(filepath.Join(n.outside, strconv.Itoa(i))); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%d publishes of fresh volumes, %d swaps; outcomes %v", iters, swaps, outcomes)
			if swaps < int64(iters) {
				t.Errorf("the racer swapped only %d times in %d publishes: the race did not run", swaps, iters)
			}
		})
	}
}

// verdict checks the node against a publish's answer, by names: after OK the
// target is a directory (no link) that is the root of the volume's tmpfs, and
// that is the only mount of Ephemera's tmpfs on the node; after an error there
// is none.
func verdict(t *testing.T, n *node, target string, ok bool) error {
	t.Helper()
	ours := 0
	var where []string
	for _, mi := range mountsBelow(t, n.base) {
		if mi.Source == "ephemera-tmpfs" {
			ours++
			where = append(where, mi.MountPoint)
		}
	}
	if !ok {
		if ours != 0 {
			return fmt.Errorf("the failed publish left mounts of the volume's tmpfs at %v", where)
		}
		return nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(target, &st); err != nil {
		return fmt.Errorf("the target: %v (volume's tmpfs mounted at %v)", err, where)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("the target %s is not a directory (mode %#o): the kubelet would bind what it leads to; the volume's tmpfs is mounted at %v", target, st.Mode&unix.S_IFMT, where)
	}
	if !isMountPoint(target) {
		return fmt.Errorf("the target %s is not a mount point; the volume's tmpfs is mounted at %v", target, where)
	}
	if m := n.mountsAt(target); len(m) != 1 || m[0].Source != "ephemera-tmpfs" {
		return fmt.Errorf("mounts at the target: %+v, want the volume's tmpfs alone", m)
	}
	if ours != 1 {
		return fmt.Errorf("%d mounts of the volume's tmpfs on the node (%v), want 1, at the target", ours, where)
	}
	return nil
}
