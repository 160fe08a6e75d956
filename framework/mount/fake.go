package mount

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// Method names of [Interface], as used by [Fake.Fail] and in [Fake.Calls].
const (
	MethodMakeTarget   = "MakeTarget"
	MethodMount        = "Mount"
	MethodSetReadOnly  = "SetReadOnly"
	MethodUnmount      = "Unmount"
	MethodIsMountPoint = "IsMountPoint"
	MethodRemoveTarget = "RemoveTarget"
	MethodInspect      = "Inspect"
	MethodOpenTarget   = "OpenTarget"
)

// Fake is an in-memory [Interface] for unit tests of the framework. It behaves
// like the Linux implementation where a test can observe the difference:
//
//   - the only directories are root (any root passed to MakeTarget or
//     RemoveTarget), those added with [Fake.AddDir] and those MakeTarget creates;
//     MakeTarget needs the parent to exist (else an error wrapping
//     fs.ErrNotExist) and refuses targets outside root and parents that are links
//     added with [Fake.AddSymlink] ([ErrSymlink]);
//   - Mount needs the target directory (else an error wrapping fs.ErrNotExist)
//     and pushes onto a per-target stack, so a double mount shows in
//     [Fake.MountCount];
//   - SetReadOnly needs a mount (else an error); Unmount pops the whole stack and
//     is nil when nothing is mounted;
//   - RemoveTarget of a mounted target fails with an error wrapping
//     syscall.EBUSY, as rmdir(2) does, of a directory with subdirectories with
//     syscall.ENOTEMPTY; a missing one is nil.
//
// Errors are injected per method with [Fake.Fail]. Paths are compared after
// filepath.Clean. The zero value is ready to use, and a Fake is safe for
// concurrent use.
type Fake struct {
	mu       sync.Mutex
	dirs     map[string]bool
	symlinks map[string]bool
	mounts   map[string][]api.Source
	readOnly map[string]bool
	fail     map[string]func(target string) error
	calls    []string
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{} }

// Fail makes method (one of the Method constants) call fn with the target before
// doing anything; when fn returns an error, the method returns it and changes
// nothing. The call is logged either way. fn runs without the Fake's lock: it may
// block, for example to hold a Mount while a test runs a concurrent request, and
// may call the Fake. A nil fn removes the injection. Fail
// panics on an unknown method name.
func (f *Fake) Fail(method string, fn func(target string) error) {
	switch method {
	case MethodMakeTarget, MethodMount, MethodSetReadOnly, MethodUnmount, MethodIsMountPoint, MethodRemoveTarget,
		MethodInspect, MethodOpenTarget:
	default:
		panic(fmt.Sprintf("mount.Fake.Fail: unknown method %q", method))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		f.fail = map[string]func(string) error{}
	}
	if fn == nil {
		delete(f.fail, method)
		return
	}
	f.fail[method] = fn
}

// AddDir makes dir and all its ancestors exist, as os.MkdirAll would (for
// example the directory the kubelet creates above a target).
func (f *Fake) AddDir(dir string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		f.dirs[d] = true
		if filepath.Dir(d) == d {
			return
		}
	}
}

// AddSymlink makes path a symbolic link: MakeTarget and RemoveTarget refuse to
// pass through it, and RemoveTarget of it removes the link.
func (f *Fake) AddSymlink(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	f.symlinks[filepath.Clean(path)] = true
}

// DirExists reports whether dir exists as a directory.
func (f *Fake) DirExists(dir string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dirs[filepath.Clean(dir)]
}

// MountCount returns how many mounts are stacked at target.
func (f *Fake) MountCount(target string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mounts[filepath.Clean(target)])
}

// Mounts returns the sources mounted at target, the first mounted first.
func (f *Fake) Mounts(target string) []api.Source {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.mounts[filepath.Clean(target)])
}

// MountedTargets returns every target with at least one mount, sorted.
func (f *Fake) MountedTargets() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for t, s := range f.mounts {
		if len(s) > 0 {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// IsReadOnly reports whether SetReadOnly succeeded on target's current mount.
func (f *Fake) IsReadOnly(target string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readOnly[filepath.Clean(target)]
}

// Calls returns the calls made so far, in order, each as "Method target", for
// example "Mount /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount".
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ResetCalls clears the call log.
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

func (f *Fake) init() {
	if f.dirs == nil {
		f.dirs = map[string]bool{}
		f.symlinks = map[string]bool{}
		f.mounts = map[string][]api.Source{}
		f.readOnly = map[string]bool{}
	}
}

// begin logs the call and runs the injected error; it returns with f.mu held.
// The injected function runs without the lock, so it may block (to hold one
// operation while others proceed) or call the Fake's methods.
func (f *Fake) begin(method, target string) (string, error) {
	f.mu.Lock()
	f.init()
	f.calls = append(f.calls, method+" "+target)
	fn := f.fail[method]
	if fn != nil {
		f.mu.Unlock()
		err := fn(target)
		f.mu.Lock()
		if err != nil {
			return "", err
		}
	}
	return filepath.Clean(target), nil
}

// walk checks the components from root (excluded) to target's parent (included).
func (f *Fake) walk(root, target string) (string, error) {
	parent, _, err := splitBeneath(root, target)
	if err != nil {
		return "", err
	}
	root = filepath.Clean(root)
	f.dirs[root] = true
	p := root
	if parent != "." {
		for _, c := range strings.Split(parent, string(filepath.Separator)) {
			p = filepath.Join(p, c)
			if f.symlinks[p] {
				return "", fmt.Errorf("%q below root %q: %w", p, root, ErrSymlink)
			}
			if !f.dirs[p] {
				return "", &fs.PathError{Op: "openat2", Path: p, Err: fs.ErrNotExist}
			}
		}
	}
	return filepath.Clean(target), nil
}

func (f *Fake) MakeTarget(root, target string) error {
	_, err := f.begin(MethodMakeTarget, target)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	t, err := f.walk(root, target)
	if err != nil {
		return err
	}
	if f.symlinks[t] {
		return fmt.Errorf("target %q: %w", target, ErrSymlink)
	}
	f.dirs[t] = true
	return nil
}

// AddMount stacks src at target as if someone else mounted it there (a mount
// an older driver left, or a foreign one), without the checks Mount makes;
// target and its ancestors become directories.
func (f *Fake) AddMount(target string, src api.Source) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	t := filepath.Clean(target)
	for d := t; ; d = filepath.Dir(d) {
		f.dirs[d] = true
		if filepath.Dir(d) == d {
			break
		}
	}
	f.mounts[t] = append(f.mounts[t], src)
}

func (f *Fake) Mount(root string, src api.Source, target string) error {
	_, err := f.begin(MethodMount, target)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	t, err := f.walk(root, target)
	if err != nil {
		return err
	}
	if f.symlinks[t] {
		return fmt.Errorf("target %q: %w", target, ErrSymlink)
	}
	if !f.dirs[t] {
		return &fs.PathError{Op: "mount", Path: target, Err: fs.ErrNotExist}
	}
	if len(f.mounts[t]) > 0 {
		return fmt.Errorf("mount on %q: %w", target, ErrMounted)
	}
	if src.IsDir() && src.Root != "" {
		// Confined: lexically beneath Root, and no component a symlink.
		if _, err := f.walk(src.Root, src.Path); err != nil {
			return fmt.Errorf("source %q beneath %q: %w", src.Path, src.Root, err)
		}
		if f.symlinks[filepath.Clean(src.Path)] {
			return fmt.Errorf("source %q beneath %q: %w", src.Path, src.Root, ErrSymlink)
		}
	}
	src.Options = slices.Clone(src.Options)
	f.mounts[t] = append(f.mounts[t], src)
	f.readOnly[t] = false
	return nil
}

func (f *Fake) SetReadOnly(root, target string, readOnly bool) error {
	_, err := f.begin(MethodSetReadOnly, target)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	t, err := f.walk(root, target)
	if err != nil {
		return err
	}
	if len(f.mounts[t]) == 0 {
		return &fs.PathError{Op: "remount", Path: target, Err: errors.New("not a mount point")}
	}
	f.readOnly[t] = readOnly
	return nil
}

func (f *Fake) Unmount(root, target string) error {
	_, err := f.begin(MethodUnmount, target)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	t, err := f.walk(root, target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if f.symlinks[t] {
		return fmt.Errorf("target %q: %w", target, ErrSymlink)
	}
	delete(f.mounts, t)
	delete(f.readOnly, t)
	return nil
}

func (f *Fake) IsMountPoint(root, target string) (bool, error) {
	mt, err := f.inspect(MethodIsMountPoint, root, target)
	return mt != nil, err
}

// Inspect describes the top mount at target: Source and FSType are those of
// the api.Source mounted there, ID counts from 1 in mount order per target.
func (f *Fake) Inspect(root, target string) (*Mounted, error) {
	return f.inspect(MethodInspect, root, target)
}

func (f *Fake) inspect(method, root, target string) (*Mounted, error) {
	_, err := f.begin(method, target)
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	t, err := f.walk(root, target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if f.symlinks[t] {
		return nil, fmt.Errorf("target %q: %w", target, ErrSymlink)
	}
	stack := f.mounts[t]
	if len(stack) == 0 {
		return nil, nil
	}
	top := stack[len(stack)-1]
	return &Mounted{ID: uint64(len(stack)), FSType: top.FSType, Source: top.Path, ReadOnly: f.readOnly[t]}, nil
}

// Shows compares the mounted source's path and type with src's.
func (f *Fake) Shows(mt *Mounted, src api.Source) (bool, error) {
	return mt != nil && mt.Source == src.Path && mt.FSType == src.FSType, nil
}

// MountedAt returns the targets where src (same path and type) is mounted.
func (f *Fake) MountedAt(src api.Source) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for t, stack := range f.mounts {
		for _, s := range stack {
			if s.Path == src.Path && s.FSType == src.FSType {
				out = append(out, t)
				break
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// Published returns the mounted targets below root/pods with an inline
// volume's shape.
func (f *Fake) Published(root string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	prefix := filepath.Join(filepath.Clean(root), volume.PodsDir) + string(filepath.Separator)
	var out []string
	for t, stack := range f.mounts {
		rest, ok := strings.CutPrefix(t, prefix)
		if !ok || len(stack) == 0 {
			continue
		}
		parts := strings.Split(rest, string(filepath.Separator))
		if len(parts) == 5 && parts[1] == volume.VolumesDir && parts[2] == volume.PluginDir && parts[4] == volume.MountDir {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out, nil
}

// OpenTarget opens the real directory at target: the Fake mounts nothing, so
// a test that has the framework write files (content, fsGroup) creates that
// directory itself. The Fake's own view must show the target as a directory.
func (f *Fake) OpenTarget(root, target string) (*os.Root, error) {
	_, err := f.begin(MethodOpenTarget, target)
	defer f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	t, err := f.walk(root, target)
	if err != nil {
		return nil, err
	}
	if !f.dirs[t] {
		return nil, &fs.PathError{Op: "open", Path: target, Err: fs.ErrNotExist}
	}
	return os.OpenRoot(target)
}

func (f *Fake) RemoveTarget(root, target string) error {
	_, err := f.begin(MethodRemoveTarget, target)
	defer f.mu.Unlock()
	if err != nil {
		return err
	}
	t, err := f.walk(root, target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(f.mounts[t]) > 0 {
		return &fs.PathError{Op: "remove", Path: target, Err: syscall.EBUSY}
	}
	for d := range f.dirs {
		if strings.HasPrefix(d, t+string(filepath.Separator)) {
			return &fs.PathError{Op: "remove", Path: target, Err: syscall.ENOTEMPTY}
		}
	}
	delete(f.symlinks, t)
	delete(f.dirs, t)
	return nil
}
