//go:build linux

package loop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
)

// requireLoop skips unless the test can bind loop devices.
func requireLoop(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat(loopControl); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
}

// newBackend returns a backend on a fresh directory and registers a cleanup that
// detaches every loop device bound to a file of that directory (also deleted
// ones) and removes the directory. Mount cleanups registered later run first.
func newBackend(t testing.TB, opts Options) *Backend {
	t.Helper()
	requireLoop(t)
	dir, err := os.MkdirTemp("", "ephemera-loop-test-")
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	opts.Dir = filepath.Join(dir, "loop")
	t.Cleanup(func() {
		loops, _ := attachedLoops()
		for _, l := range loops {
			if strings.HasPrefix(l.backing, dir+"/") {
				if err := detach("/dev/" + l.name); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
		os.RemoveAll(dir)
	})
	return mustNew(t, opts)
}

// mountDev mounts dev at a new directory and unmounts it at cleanup.
func mountDev(t testing.TB, dev, fsType string) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, fsType, unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatalf("mount %s: %v", dev, err)
	}
	t.Cleanup(func() { unmount(t, mnt) })
	return mnt
}

func unmount(t testing.TB, mnt string) {
	if err := unix.Unmount(mnt, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		t.Errorf("unmount %s: %v", mnt, err)
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	}
}

func volume(id string, size int64, params api.Params) *api.Volume {
	return &api.Volume{ID: id, Size: size, Params: params}
}

func create(t testing.TB, b *Backend, v *api.Volume) api.Source {
	t.Helper()
	if err := framework.ValidateVolume(b, v); err != nil {
		t.Fatal(err)
	}
	src, err := b.Create(context.Background(), v)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return src
}

// boundTo returns the loop devices the kernel reports for path (sysfs).
func boundTo(t testing.TB, path string) []string {
	t.Helper()
	loops, err := attachedLoops()
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, l := range loops {
		if l.backing == path {
			devs = append(devs, "/dev/"+l.name)
		}
	}
	return devs
}

// waitUnbound waits for the kernel to finish detaching dev.
func waitUnbound(t testing.TB, dev string) {
	t.Helper()
	f := filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file")
	for range 100 {
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("%s is still bound", dev)
}

// fill writes to dir/name until an error and returns the bytes written.
func fill(t testing.TB, dir string, limit int64) (int64, error) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{0xa5}, 1<<20)
	var n int64
	for n < limit {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			return n, err
		}
	}
	return n, f.Sync()
}

func TestCreateExt4(t *testing.T) {
	b := newBackend(t, Options{})
	v := volume("csi-ext4", 64<<20, nil)
	src := create(t, b, v)
	path := filepath.Join(b.opts.Dir, "csi-ext4.img")
	if src.FSType != FSExt4 || !strings.HasPrefix(src.Path, "/dev/loop") {
		t.Fatalf("source = %+v", src)
	}
	if v.State["device"] != src.Path || v.State["file"] != path {
		t.Errorf("state = %v", v.State)
	}
	if devs := boundTo(t, path); len(devs) != 1 || devs[0] != src.Path {
		t.Fatalf("bound to %s: %v, want [%s]", path, devs, src.Path)
	}
	if out, err := exec.Command("losetup", "-j", path).CombinedOutput(); err == nil && !strings.Contains(string(out), src.Path) {
		t.Errorf("losetup -j %s: %s", path, out)
	}
	if fsType, err := probe(src.Path); err != nil || fsType != FSExt4 {
		t.Fatalf("probe = %q, %v", fsType, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Size != 64<<20 || st.Blocks*512 >= 64<<20 {
		t.Errorf("backing file: size %d, allocated %d, %v; want sparse 64Mi", st.Size, st.Blocks*512, err)
	}
	if err := b.Check(context.Background(), v); err != nil {
		t.Errorf("Check healthy volume: %v", err)
	}

	mnt := mountDev(t, src.Path, src.FSType)
	if err := unix.Stat(mnt, &st); err != nil || st.Mode&0o7777 != 0o777 || st.Uid != 0 {
		t.Errorf("root: mode %o uid %d, %v; want 0777 root", st.Mode, st.Uid, err)
	}
	n, err := fill(t, mnt, 70<<20)
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("writing 70MiB to a 64MiB volume: %d bytes, %v; want ENOSPC", n, err)
	}
	t.Logf("ENOSPC after %d MiB", n>>20)
	if err := os.WriteFile(filepath.Join(mnt, "marker"), []byte("kept"), 0o644); err != nil {
		// The volume is full: make room first.
		os.Remove(filepath.Join(mnt, "fill"))
		if err := os.WriteFile(filepath.Join(mnt, "marker"), []byte("kept"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Delete(context.Background(), v); !errors.Is(err, api.ErrBusy) {
		t.Errorf("Delete while mounted = %v, want ErrBusy", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("Delete while mounted removed the file: %v", err)
	}
	unmount(t, mnt)

	// Create again: same device, same filesystem (no mkfs), data kept.
	v2 := volume("csi-ext4", 64<<20, nil)
	src2 := create(t, b, v2)
	if src2.Path != src.Path || src2.FSType != FSExt4 {
		t.Errorf("second Create = %+v, want %+v", src2, src)
	}
	mnt = mountDev(t, src2.Path, src2.FSType)
	if data, err := os.ReadFile(filepath.Join(mnt, "marker")); err != nil || string(data) != "kept" {
		t.Errorf("marker after second Create: %q, %v", data, err)
	}
	unmount(t, mnt)

	if err := b.Delete(context.Background(), v2); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	waitUnbound(t, src.Path)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("backing file after Delete: %v", err)
	}
	if err := b.Delete(context.Background(), v2); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if err := b.Check(context.Background(), v2); err == nil {
		t.Error("Check of deleted volume = nil")
	}
	if ids, err := b.List(context.Background()); err != nil || len(ids) != 0 {
		t.Errorf("List after Delete = %v, %v", ids, err)
	}
}

func TestCreateOwner(t *testing.T) {
	for _, tt := range []struct {
		fsType string
		size   int64
		mode   string
		want   uint32
	}{
		{FSExt4, 8 << 20, "1770", 0o1770},
		{FSExt4, 8 << 20, "0755", 0o755},
		{FSXFS, MinSizeXFS, "2750", 0o2750},
	} {
		t.Run(tt.fsType+"-"+tt.mode, func(t *testing.T) {
			b := newBackend(t, Options{})
			v := volume("csi-owner", tt.size, api.Params{"fsType": tt.fsType, "mode": tt.mode, "uid": "1000", "gid": "2000"})
			src := create(t, b, v)
			mnt := mountDev(t, src.Path, src.FSType)
			var st unix.Stat_t
			if err := unix.Stat(mnt, &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&0o7777 != tt.want || st.Uid != 1000 || st.Gid != 2000 {
				t.Errorf("root: mode %o %d:%d, want %o 1000:2000", st.Mode&0o7777, st.Uid, st.Gid, tt.want)
			}
		})
	}
}

func TestCreateXFS(t *testing.T) {
	b := newBackend(t, Options{DefaultFSType: FSXFS})
	v := volume("csi-xfs", MinSizeXFS, nil)
	src := create(t, b, v)
	if src.FSType != FSXFS || v.FSType != FSXFS {
		t.Fatalf("source = %+v, FSType %q", src, v.FSType)
	}
	if fsType, err := probe(src.Path); err != nil || fsType != FSXFS {
		t.Fatalf("probe = %q, %v", fsType, err)
	}
	mnt := mountDev(t, src.Path, src.FSType)
	n, err := fill(t, mnt, MinSizeXFS+(10<<20))
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("writing past %d bytes: %d bytes, %v; want ENOSPC", MinSizeXFS, n, err)
	}
	t.Logf("ENOSPC after %d MiB", n>>20)
	unmount(t, mnt)
	if src2 := create(t, b, volume("csi-xfs", MinSizeXFS, nil)); src2.Path != src.Path {
		t.Errorf("second Create = %+v, want %+v", src2, src)
	}
	if err := b.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	waitUnbound(t, src.Path)
}

// Crash window (a): the backing file exists, nothing is attached.
func TestCrashFileOnly(t *testing.T) {
	b := newBackend(t, Options{})
	if err := os.MkdirAll(b.opts.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(b.opts.Dir, "csi-a.img")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ids, err := b.List(context.Background())
	if err != nil || len(ids) != 1 || ids[0] != "csi-a" {
		t.Fatalf("List = %v, %v", ids, err)
	}
	if err := b.Delete(context.Background(), &api.Volume{ID: "csi-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file after Delete: %v", err)
	}
	// A zero-length file left by a crash before ftruncate is sized by Create.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v := volume("csi-a", 4<<20, nil)
	create(t, b, v)
	if err := b.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
}

// attachOnly reproduces a crash after the loop device was bound, before mkfs.
func attachOnly(t *testing.T, b *Backend, id string, size int64) (path, dev string) {
	t.Helper()
	if err := os.MkdirAll(b.opts.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(b.opts.Dir, id+".img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	dev, err = attach(int(f.Fd()), path, true)
	if err != nil {
		t.Fatal(err)
	}
	if fsType, _ := probe(dev); fsType != "" {
		t.Fatalf("fresh device has %q", fsType)
	}
	return path, dev
}

// Crash window (b): attached but not formatted.
func TestCrashAttachedNoFS(t *testing.T) {
	t.Run("create finishes", func(t *testing.T) {
		b := newBackend(t, Options{})
		_, dev := attachOnly(t, b, "csi-b", 16<<20)
		v := volume("csi-b", 16<<20, nil)
		src := create(t, b, v)
		if src.Path != dev {
			t.Errorf("Create used %s, want the attached %s", src.Path, dev)
		}
		if fsType, err := probe(dev); fsType != FSExt4 {
			t.Errorf("probe after Create = %q, %v", fsType, err)
		}
		if err := b.Delete(context.Background(), v); err != nil {
			t.Fatal(err)
		}
		waitUnbound(t, dev)
	})
	t.Run("delete detaches", func(t *testing.T) {
		b := newBackend(t, Options{})
		path, dev := attachOnly(t, b, "csi-b", 16<<20)
		if ids, err := b.List(context.Background()); err != nil || len(ids) != 1 || ids[0] != "csi-b" {
			t.Errorf("List = %v, %v", ids, err)
		}
		if err := b.Delete(context.Background(), &api.Volume{ID: "csi-b"}); err != nil {
			t.Fatal(err)
		}
		waitUnbound(t, dev)
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("file after Delete: %v", err)
		}
	})
}

// Crash window (c): the backing file was deleted while its device is bound.
func TestCrashFileDeleted(t *testing.T) {
	b := newBackend(t, Options{})
	v := volume("csi-c", 8<<20, nil)
	src := create(t, b, v)
	if err := os.Remove(v.State["file"]); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(context.Background(), v); err == nil {
		t.Error("Check with the backing file deleted = nil")
	}
	ids, err := b.List(context.Background())
	if err != nil || len(ids) != 1 || ids[0] != "csi-c" {
		t.Fatalf("List = %v, %v; want the ID of the leaked device", ids, err)
	}
	// Delete works from the ID alone (State is not persisted after a crash).
	if err := b.Delete(context.Background(), &api.Volume{ID: "csi-c"}); err != nil {
		t.Fatal(err)
	}
	waitUnbound(t, src.Path)
	if ids, err := b.List(context.Background()); err != nil || len(ids) != 0 {
		t.Errorf("List after Delete = %v, %v", ids, err)
	}
}

// A device bound to an earlier, deleted file of the same path is not reused.
func TestCreateIgnoresStaleDevice(t *testing.T) {
	b := newBackend(t, Options{})
	v := volume("csi-s", 8<<20, nil)
	old := create(t, b, v)
	if err := os.Remove(v.State["file"]); err != nil {
		t.Fatal(err)
	}
	src := create(t, b, volume("csi-s", 8<<20, nil))
	if src.Path == old.Path {
		t.Fatalf("Create reused %s, bound to the deleted file", old.Path)
	}
	if err := b.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	waitUnbound(t, old.Path)
	waitUnbound(t, src.Path)
}

func TestCheckDetached(t *testing.T) {
	b := newBackend(t, Options{})
	v := volume("csi-h", 4<<20, nil)
	src := create(t, b, v)
	if err := b.Check(context.Background(), v); err != nil {
		t.Fatalf("Check = %v", err)
	}
	if err := detach(src.Path); err != nil {
		t.Fatal(err)
	}
	waitUnbound(t, src.Path)
	if err := b.Check(context.Background(), v); err == nil || !strings.Contains(err.Error(), "no loop device") {
		t.Errorf("Check of detached volume = %v", err)
	}
}

// Concurrent Creates race for the same free loop device; every one must end
// up with its own.
func TestCreateConcurrent(t *testing.T) {
	b := newBackend(t, Options{})
	const n = 8
	srcs := make([]api.Source, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			v := volume(fmt.Sprintf("csi-p%d", i), 4<<20, nil)
			if errs[i] = framework.ValidateVolume(b, v); errs[i] == nil {
				srcs[i], errs[i] = b.Create(context.Background(), v)
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, src := range srcs {
		if errs[i] != nil {
			t.Errorf("Create %d: %v", i, errs[i])
			continue
		}
		if seen[src.Path] {
			t.Errorf("device %s handed out twice", src.Path)
		}
		seen[src.Path] = true
		if dio, _ := os.ReadFile(filepath.Join(sysBlock, filepath.Base(src.Path), "loop", "dio")); strings.TrimSpace(string(dio)) != "1" {
			t.Errorf("%s: dio = %q, want 1", src.Path, dio)
		}
	}
	ids, err := b.List(context.Background())
	if err != nil || len(ids) != n {
		t.Errorf("List = %v, %v", ids, err)
	}
	for _, id := range ids {
		if err := b.Delete(context.Background(), &api.Volume{ID: id}); err != nil {
			t.Error(err)
		}
	}
}

func TestPreallocate(t *testing.T) {
	b := newBackend(t, Options{Preallocate: true})
	v := volume("csi-pre", 16<<20, nil)
	create(t, b, v)
	var st unix.Stat_t
	if err := unix.Stat(v.State["file"], &st); err != nil || st.Blocks*512 < 16<<20 {
		t.Errorf("allocated %d bytes, %v; want 16Mi", st.Blocks*512, err)
	}
	create(t, b, volume("csi-pre", 16<<20, nil)) // again: idempotent
	if err := b.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
}

func TestListMissingDir(t *testing.T) {
	b := newBackend(t, Options{})
	if ids, err := b.List(context.Background()); err != nil || ids != nil {
		t.Errorf("List = %v, %v", ids, err)
	}
}

func TestCreateCanceled(t *testing.T) {
	b := newBackend(t, Options{})
	v := volume("csi-x", 8<<20, nil)
	if err := framework.ValidateVolume(b, v); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Create(ctx, v); !errors.Is(err, context.Canceled) {
		t.Errorf("Create with canceled context = %v", err)
	}
	// The rollback the framework does:
	if err := b.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
}

func TestCreateMissingMkfs(t *testing.T) {
	b := newBackend(t, Options{MkfsExt4: "/nonexistent/mkfs.ext4"})
	v := volume("csi-m", 8<<20, nil)
	if err := framework.ValidateVolume(b, v); err != nil {
		t.Fatal(err)
	}
	_, err := b.Create(context.Background(), v)
	if err == nil {
		t.Fatal("Create without mkfs = nil")
	}
	t.Log(err)
	if err := b.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkCreateDelete(b *testing.B) {
	for _, bio := range []bool{false, true} {
		name := "directio"
		if bio {
			name = "buffered"
		}
		b.Run(name, func(b *testing.B) {
			be := newBackend(b, Options{BufferedIO: bio})
			ctx := context.Background()
			var attachT, mkfsT, detachT time.Duration
			iters := 0
			for b.Loop() {
				iters++
				v := volume("csi-bench", 64<<20, nil)
				if err := framework.ValidateVolume(be, v); err != nil {
					b.Fatal(err)
				}
				if err := os.MkdirAll(be.opts.Dir, 0o700); err != nil {
					b.Fatal(err)
				}
				// Phase timings, measured with the same primitives Create uses.
				t0 := time.Now()
				path := filepath.Join(be.opts.Dir, "csi-bench.img")
				f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.Truncate(v.Size); err != nil {
					b.Fatal(err)
				}
				if _, err := attach(int(f.Fd()), path, !bio); err != nil {
					b.Fatal(err)
				}
				f.Close()
				t1 := time.Now()
				if _, err := be.Create(ctx, v); err != nil { // finds the device, runs mkfs
					b.Fatal(err)
				}
				t2 := time.Now()
				if err := be.Delete(ctx, v); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				attachT += t1.Sub(t0)
				mkfsT += t2.Sub(t1)
				detachT += t3.Sub(t2)
			}
			n := time.Duration(iters)
			b.ReportMetric(float64((attachT / n).Microseconds()), "attach-µs/op")
			b.ReportMetric(float64((mkfsT / n).Microseconds()), "create+mkfs-µs/op")
			b.ReportMetric(float64((detachT / n).Microseconds()), "delete-µs/op")
		})
	}
}

// BenchmarkMkfs times the formatting step alone on an attached device.
func BenchmarkMkfs(b *testing.B) {
	for _, bc := range []struct {
		name   string
		fsType string
		size   int64
		mode   fs.FileMode
	}{
		{"ext4-64Mi-mkfs-only", FSExt4, 64 << 20, 0o755},
		{"ext4-64Mi-mkfs+debugfs", FSExt4, 64 << 20, 0o777},
		{"xfs-300Mi", FSXFS, MinSizeXFS, 0o777},
	} {
		b.Run(bc.name, func(b *testing.B) {
			be := newBackend(b, Options{})
			if err := os.MkdirAll(be.opts.Dir, 0o700); err != nil {
				b.Fatal(err)
			}
			path := filepath.Join(be.opts.Dir, "csi-mkfs.img")
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(bc.size); err != nil {
				b.Fatal(err)
			}
			dev, err := attach(int(f.Fd()), path, true)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := be.mkfs(context.Background(), bc.fsType, dev, rootAttrs{mode: bc.mode}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
