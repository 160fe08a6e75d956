package vhdx

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ephemera-csi/ephemera/framework/stamp"
)

// fakeHost models a Windows node for the backend: files and folders are real
// (in a temporary directory), virtual disks, volumes and mount points are in
// memory. Every call that changes something is recorded; fail makes one
// operation fail once. Every method returns ctx.Err() instead of starting when
// ctx is done, as the Windows host does; cancelAt ends a context at a chosen
// step.
type fakeHost struct {
	mu       sync.Mutex
	calls    []string
	fail     map[string]error
	steps    []string           // every method entered, in order
	cancelAt int                // when > 0, cancel as the cancelAt-th method from now starts
	cancel   context.CancelFunc // what cancelAt calls
	nextDisk uint32
	attached map[string]uint32 // file -> disk
	disks    map[uint32]*fakeDisk
	files    map[string]*fakeDisk // file -> its content (disk state survives detach)
	mounts   map[string]string    // folder -> volume ID
}

type fakeDisk struct {
	online, partitioned, formatted bool
	volumeID                       string
	data                           string // stands for the filesystem's content
}

func newFakeHost() *fakeHost {
	return &fakeHost{fail: map[string]error{}, nextDisk: 1, attached: map[string]uint32{},
		disks: map[uint32]*fakeDisk{}, files: map[string]*fakeDisk{}, mounts: map[string]string{}}
}

var errInjected = errors.New("injected failure")

// enter starts a method: it counts the step, ends the context there when the
// test asked for it, and refuses to start once ctx is done.
func (f *fakeHost) enter(ctx context.Context, op string) error {
	f.steps = append(f.steps, op)
	if len(f.steps) == f.cancelAt {
		f.cancel()
	}
	return ctx.Err()
}

// cancelAtStep makes cancel run as the n-th host method from now (1-based)
// starts, before it does anything.
func (f *fakeHost) cancelAtStep(n int, cancel context.CancelFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps, f.cancelAt, f.cancel = nil, n, cancel
}

// stepsTaken returns the methods entered since the last cancelAtStep or
// reset.
func (f *fakeHost) stepsTaken() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.steps)
}

func (f *fakeHost) call(op string, args ...any) error {
	parts := []string{op}
	for _, a := range args {
		parts = append(parts, fmt.Sprint(a))
	}
	f.calls = append(f.calls, strings.Join(parts, " "))
	if err, ok := f.fail[op]; ok {
		delete(f.fail, op)
		return err
	}
	return nil
}

func (f *fakeHost) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, strings.Fields(c)[0])
	}
	return out
}

func (f *fakeHost) reset() {
	f.mu.Lock()
	f.calls, f.steps, f.cancelAt = nil, nil, 0
	f.mu.Unlock()
}

// reboot detaches every virtual disk and forgets the mount points, as a node
// restart does to disks attached with a permanent lifetime.
func (f *fakeHost) reboot() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attached, f.disks, f.mounts = map[string]uint32{}, map[uint32]*fakeDisk{}, map[string]string{}
}

func (f *fakeHost) FileExists(ctx context.Context, path string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "FileExists"); err != nil {
		return false, err
	}
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (f *fakeHost) CreateVHDX(ctx context.Context, path string, size int64, dynamic bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "CreateVHDX"); err != nil {
		return err
	}
	if err := f.call("CreateVHDX", filepath.Base(path), size, dynamic); err != nil {
		return err
	}
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	f.files[path] = &fakeDisk{}
	return fh.Close()
}

func (f *fakeHost) Rename(ctx context.Context, from, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "Rename"); err != nil {
		return err
	}
	if err := f.call("Rename", filepath.Base(from), filepath.Base(to)); err != nil {
		return err
	}
	if err := os.Rename(from, to); err != nil {
		return err
	}
	f.files[to] = f.files[from]
	delete(f.files, from)
	return nil
}

func (f *fakeHost) RemoveFile(ctx context.Context, path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "RemoveFile"); err != nil {
		return err
	}
	if _, ok := f.attached[path]; ok {
		return fmt.Errorf("remove %s: the file is in use (attached)", path)
	}
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := f.call("RemoveFile", filepath.Base(path)); err != nil {
		return err
	}
	delete(f.files, path)
	return os.Remove(path)
}

func (f *fakeHost) AttachedDisk(ctx context.Context, path string) (uint32, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "AttachedDisk"); err != nil {
		return 0, false, err
	}
	if _, err := os.Lstat(path); err != nil {
		return 0, false, err
	}
	n, ok := f.attached[path]
	return n, ok, nil
}

func (f *fakeHost) Attach(ctx context.Context, path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "Attach"); err != nil {
		return err
	}
	if err := f.call("Attach", filepath.Base(path)); err != nil {
		return err
	}
	if _, ok := f.attached[path]; ok {
		return errors.New("already attached")
	}
	content, ok := f.files[path]
	if !ok {
		return fmt.Errorf("attach %s: not a VHDX", path)
	}
	n := f.nextDisk
	f.nextDisk++
	f.attached[path], f.disks[n] = n, content
	return nil
}

func (f *fakeHost) Detach(ctx context.Context, path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "Detach"); err != nil {
		return err
	}
	if err := f.call("Detach", filepath.Base(path)); err != nil {
		return err
	}
	n, ok := f.attached[path]
	if !ok {
		return errors.New("not attached")
	}
	for dir, id := range f.mounts {
		if id == f.disks[n].volumeID {
			return fmt.Errorf("detach %s: volume still mounted at %s", path, dir)
		}
	}
	delete(f.attached, path)
	delete(f.disks, n)
	return nil
}

func (f *fakeHost) disk(n uint32) (*fakeDisk, error) {
	d, ok := f.disks[n]
	if !ok {
		return nil, fmt.Errorf("no disk %d", n)
	}
	return d, nil
}

func (f *fakeHost) PrepareDisk(ctx context.Context, n uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "PrepareDisk"); err != nil {
		return err
	}
	if err := f.call("PrepareDisk", n); err != nil {
		return err
	}
	d, err := f.disk(n)
	if err != nil {
		return err
	}
	d.online = true
	if !d.partitioned {
		d.partitioned, d.volumeID = true, fmt.Sprintf(`\\?\Volume{%08d-0000-0000-0000-000000000000}\`, len(f.files)*1000+int(n))
	}
	return nil
}

func (f *fakeHost) VolumeOnDisk(ctx context.Context, n uint32) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "VolumeOnDisk"); err != nil {
		return "", err
	}
	d, err := f.disk(n)
	if err != nil {
		return "", err
	}
	if !d.partitioned {
		return "", fmt.Errorf("disk %d has no partition", n)
	}
	return d.volumeID, nil
}

func (f *fakeHost) volume(id string) (*fakeDisk, error) {
	for _, d := range f.disks {
		if d.volumeID == id {
			return d, nil
		}
	}
	return nil, fmt.Errorf("no volume %s", id)
}

func (f *fakeHost) IsFormatted(ctx context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "IsFormatted"); err != nil {
		return false, err
	}
	d, err := f.volume(id)
	if err != nil {
		return false, err
	}
	return d.formatted, nil
}

func (f *fakeHost) Format(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "Format"); err != nil {
		return err
	}
	if err := f.call("Format", id); err != nil {
		return err
	}
	d, err := f.volume(id)
	if err != nil {
		return err
	}
	d.formatted, d.data = true, ""
	return nil
}

func (f *fakeHost) MkdirAll(ctx context.Context, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "MkdirAll"); err != nil {
		return err
	}
	return os.MkdirAll(dir, 0o700)
}

func (f *fakeHost) MountedVolume(ctx context.Context, dir string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "MountedVolume"); err != nil {
		return "", err
	}
	return f.mounts[dir], nil
}

func (f *fakeHost) Mount(ctx context.Context, id, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "Mount"); err != nil {
		return err
	}
	if err := f.call("Mount", filepath.Base(dir)); err != nil {
		return err
	}
	if _, err := f.volume(id); err != nil {
		return err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("mount at %s: not a directory: %v", dir, err)
	}
	if _, ok := f.mounts[dir]; ok {
		return errors.New("already a mount point")
	}
	f.mounts[dir] = id
	return nil
}

func (f *fakeHost) Unmount(ctx context.Context, id, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "Unmount"); err != nil {
		return err
	}
	if err := f.call("Unmount", filepath.Base(dir)); err != nil {
		return err
	}
	if f.mounts[dir] != id {
		return fmt.Errorf("%s is not mounted at %s", id, dir)
	}
	delete(f.mounts, dir)
	return nil
}

func (f *fakeHost) RemoveDir(ctx context.Context, dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "RemoveDir"); err != nil {
		return err
	}
	if _, ok := f.mounts[dir]; ok {
		return fmt.Errorf("remove %s: a volume is mounted there", dir)
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := f.call("RemoveDir", filepath.Base(dir)); err != nil {
		return err
	}
	return os.Remove(dir)
}

func (f *fakeHost) ListFiles(ctx context.Context, dir string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "ListFiles"); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, err
}

func (f *fakeHost) ReadStamp(ctx context.Context, dir string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "ReadStamp"); err != nil {
		return "", err
	}
	return stamp.Read(dir)
}

func (f *fakeHost) WriteStamp(ctx context.Context, dir, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(ctx, "WriteStamp"); err != nil {
		return err
	}
	if err := f.call("WriteStamp", id); err != nil {
		return err
	}
	return stamp.Write(dir, id)
}

// leftovers reports what is left on the node, "" when nothing. The storage
// stamp is not a leftover: it belongs to the area, not to a volume.
func (f *fakeHost) leftovers(dir string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var left []string
	for p := range f.attached {
		left = append(left, "attached "+p)
	}
	for p := range f.mounts {
		left = append(left, "mounted "+p)
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != dir && !(d.IsDir() && (p == filepath.Join(dir, mntDir))) && p != filepath.Join(dir, stamp.FileName) {
			left = append(left, "file "+p)
		}
		return nil
	})
	sort.Strings(left)
	return strings.Join(left, "; ")
}
