package mount

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/winpath"
)

// memFS is an in-memory linkFS that can hold what Windows reports: a symbolic
// link, or a junction (ModeIrregular).
type memFS struct {
	entries map[string]memEntry
	calls   []string
}

type memEntry struct {
	mode fs.FileMode
	dest string // link target
}

func newMemFS() *memFS { return &memFS{entries: map[string]memEntry{}} }

func (m *memFS) add(path string, mode fs.FileMode, dest string) *memFS {
	m.entries[filepath.Clean(path)] = memEntry{mode: mode, dest: dest}
	return m
}

type memInfo struct {
	name string
	e    memEntry
}

func (i memInfo) Name() string       { return filepath.Base(i.name) }
func (i memInfo) Size() int64        { return 0 }
func (i memInfo) Mode() fs.FileMode  { return i.e.mode }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.e.mode.IsDir() }
func (i memInfo) Sys() any           { return nil }

func (m *memFS) Lstat(name string) (fs.FileInfo, error) {
	e, ok := m.entries[filepath.Clean(name)]
	if !ok {
		return nil, &fs.PathError{Op: "lstat", Path: name, Err: fs.ErrNotExist}
	}
	return memInfo{name, e}, nil
}

func (m *memFS) Stat(name string) (fs.FileInfo, error) {
	for range 8 {
		fi, err := m.Lstat(name)
		if err != nil || !isLink(fi.Mode()) {
			return fi, err
		}
		name = m.entries[filepath.Clean(name)].dest
	}
	return nil, &fs.PathError{Op: "stat", Path: name, Err: errors.New("too many links")}
}

func (m *memFS) Readlink(name string) (string, error) {
	e, ok := m.entries[filepath.Clean(name)]
	if !ok || !isLink(e.mode) {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: errors.New("not a link")}
	}
	return e.dest, nil
}

func (m *memFS) Symlink(oldname, newname string) error {
	m.calls = append(m.calls, "symlink "+newname+" -> "+oldname)
	if _, ok := m.entries[filepath.Clean(newname)]; ok {
		return &fs.PathError{Op: "symlink", Path: newname, Err: fs.ErrExist}
	}
	if _, ok := m.entries[filepath.Dir(filepath.Clean(newname))]; !ok {
		return &fs.PathError{Op: "symlink", Path: newname, Err: fs.ErrNotExist}
	}
	m.add(newname, fs.ModeSymlink, oldname)
	return nil
}

func (m *memFS) Remove(name string) error {
	m.calls = append(m.calls, "remove "+name)
	name = filepath.Clean(name)
	if _, ok := m.entries[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	if empty, _ := m.IsEmptyDir(name); !empty && m.entries[name].mode.IsDir() {
		return &fs.PathError{Op: "remove", Path: name, Err: errors.New("directory not empty")}
	}
	delete(m.entries, name)
	return nil
}

func (m *memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	dir := filepath.Clean(name)
	if _, ok := m.entries[dir]; !ok {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	var out []fs.DirEntry
	for p, e := range m.entries {
		if filepath.Dir(p) == dir && p != dir {
			out = append(out, fs.FileInfoToDirEntry(memInfo{p, e}))
		}
	}
	return out, nil
}

func (m *memFS) IsEmptyDir(name string) (bool, error) {
	prefix := filepath.Clean(name) + string(filepath.Separator)
	for p := range m.entries {
		if strings.HasPrefix(p, prefix) {
			return false, nil
		}
	}
	return true, nil
}

// abs turns a slash path into an absolute path of the host (so the tests run on
// Windows as well).
func abs(p string) string {
	if filepath.Separator == '\\' {
		return `c:` + filepath.FromSlash(p)
	}
	return p
}

func TestNormalizeWindowsPath(t *testing.T) {
	for in, want := range map[string]string{
		`/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount`: `c:\var\lib\kubelet\pods\u\volumes\kubernetes.io~csi\v\mount`,
		`\var\lib\kubelet`:        `c:\var\lib\kubelet`,
		`C:\var\lib\kubelet`:      `C:\var\lib\kubelet`,
		`C:/var/lib/kubelet/pods`: `C:\var\lib\kubelet\pods`,
		`c:\var/lib\kubelet`:      `c:\var\lib\kubelet`,
		`\\server\share\dir`:      `\\server\share\dir`,
		`relative/dir`:            `relative\dir`,
		``:                        ``,
	} {
		if got := NormalizeWindowsPath(in); got != want {
			t.Errorf("NormalizeWindowsPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSplitBeneath(t *testing.T) {
	root := abs("/var/lib/kubelet")
	for _, tc := range []struct {
		target       string
		parent, base string
		ok           bool
	}{
		{abs("/var/lib/kubelet/pods/u/mount"), filepath.FromSlash("pods/u"), "mount", true},
		{abs("/var/lib/kubelet/mount"), ".", "mount", true},
		{abs("/var/lib/kubelet/pods/../mount"), ".", "mount", true},
		{abs("/var/lib/kubelet"), "", "", false},
		{abs("/var/lib/kubelet/"), "", "", false},
		{abs("/var/lib/kubelet2/mount"), "", "", false},
		{abs("/var/lib/kubelet/../x"), "", "", false},
		{abs("/var/lib"), "", "", false},
		{"pods/u/mount", "", "", false},
	} {
		parent, base, err := splitBeneath(root, tc.target)
		if (err == nil) != tc.ok || parent != tc.parent || base != tc.base {
			t.Errorf("splitBeneath(%q) = %q, %q, %v; want %q, %q, ok=%v", tc.target, parent, base, err, tc.parent, tc.base, tc.ok)
		}
	}
}

func TestLinkMount(t *testing.T) {
	root, vol, data := abs("/k"), abs("/k/pods/u/vol"), abs("/data/v1")
	target := filepath.Join(vol, "mount")
	dirFS := func() *memFS {
		return newMemFS().add(root, fs.ModeDir, "").add(abs("/k/pods"), fs.ModeDir, "").
			add(abs("/k/pods/u"), fs.ModeDir, "").add(vol, fs.ModeDir, "").
			add(abs("/data"), fs.ModeDir, "").add(data, fs.ModeDir, "")
	}
	for _, tc := range []struct {
		name    string
		fs      func() *memFS
		src     api.Source
		wantErr error // nil: success; errAny: some error
		want    []string
		windows bool // compare link destinations with Windows rules
	}{
		{
			name: "nothing at target",
			fs:   dirFS,
			src:  api.Source{Path: data},
			want: []string{"symlink " + target + " -> " + data},
		},
		{
			name: "empty directory at target is replaced",
			fs:   func() *memFS { return dirFS().add(target, fs.ModeDir, "") },
			src:  api.Source{Path: data},
			want: []string{"remove " + target, "symlink " + target + " -> " + data},
		},
		{
			name:    "non-empty directory at target",
			fs:      func() *memFS { return dirFS().add(target, fs.ModeDir, "").add(filepath.Join(target, "f"), 0, "") },
			src:     api.Source{Path: data},
			wantErr: ErrNotEmpty,
		},
		{
			name: "already linked to the source",
			fs:   func() *memFS { return dirFS().add(target, fs.ModeSymlink, data+string(filepath.Separator)) },
			src:  api.Source{Path: data},
		},
		{
			name: "already linked, Windows spelling of the source",
			fs: func() *memFS {
				return dirFS().add(target, fs.ModeSymlink, `\\?\C:`+strings.ToUpper(strings.ReplaceAll(data, "/", `\`))+`\`)
			},
			src:     api.Source{Path: data},
			windows: true,
		},
		{
			name: "live link elsewhere",
			fs: func() *memFS {
				return dirFS().add(abs("/elsewhere"), fs.ModeDir, "").add(target, fs.ModeSymlink, abs("/elsewhere"))
			},
			src:     api.Source{Path: data},
			wantErr: fs.ErrExist,
		},
		{
			name: "dangling link elsewhere is replaced",
			fs:   func() *memFS { return dirFS().add(target, fs.ModeSymlink, abs("/gone")) },
			src:  api.Source{Path: data},
			want: []string{"remove " + target, "symlink " + target + " -> " + data},
		},
		{
			name: "live junction at target",
			fs: func() *memFS {
				return dirFS().add(abs("/elsewhere"), fs.ModeDir, "").add(target, fs.ModeIrregular, abs("/elsewhere"))
			},
			src:     api.Source{Path: data},
			wantErr: fs.ErrExist,
		},
		{
			name: "dangling junction is replaced",
			fs:   func() *memFS { return dirFS().add(target, fs.ModeIrregular, "") },
			src:  api.Source{Path: data},
			want: []string{"remove " + target, "symlink " + target + " -> " + data},
		},
		{
			name:    "file at target",
			fs:      func() *memFS { return dirFS().add(target, 0, "") },
			src:     api.Source{Path: data},
			wantErr: errAny,
		},
		{
			name:    "source missing: no file link is made",
			fs:      dirFS,
			src:     api.Source{Path: abs("/data/missing")},
			wantErr: fs.ErrNotExist,
		},
		{
			name:    "source is a file",
			fs:      func() *memFS { return dirFS().add(abs("/data/file"), 0, "") },
			src:     api.Source{Path: abs("/data/file")},
			wantErr: errAny,
		},
		{
			name:    "relative source",
			fs:      dirFS,
			src:     api.Source{Path: "data/v1"},
			wantErr: errAny,
		},
		{
			name:    "tmpfs",
			fs:      dirFS,
			src:     api.Source{Path: "tmpfs", FSType: "tmpfs", Options: []string{"size=1m"}},
			wantErr: ErrNotSupported,
		},
		{
			name:    "filesystem",
			fs:      dirFS,
			src:     api.Source{Path: `\\.\PhysicalDrive2`, FSType: "ntfs"},
			wantErr: ErrNotSupported,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mfs := tc.fs()
			m := newLinkMounter(mfs, nil)
			m.windows = m.windows || tc.windows
			err := m.Mount(root, tc.src, target)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("Mount: %v", err)
			case tc.wantErr == errAny && err == nil, tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("Mount: %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil && slices.ContainsFunc(mfs.calls, func(c string) bool { return strings.HasPrefix(c, "remove") || strings.HasPrefix(c, "symlink") }) {
				t.Errorf("failed Mount changed the filesystem: %v", mfs.calls)
			}
			if tc.wantErr == nil && !slices.Equal(mfs.calls, tc.want) {
				t.Errorf("calls %q, want %q", mfs.calls, tc.want)
			}
			if tc.wantErr == nil && !tc.windows { // memFS cannot follow a Windows spelling
				if ok, err := m.IsMountPoint(root, target); !ok || err != nil {
					t.Errorf("IsMountPoint after Mount: %v, %v", ok, err)
				}
			}
		})
	}
}

var errAny = errors.New("any error")

func TestLinkUnmountAndIsMountPoint(t *testing.T) {
	root, target := abs("/k"), abs("/k/t")
	for _, tc := range []struct {
		name        string
		mode        fs.FileMode
		exists      bool
		dangling    bool
		mounted     bool
		wantRemoved bool
	}{
		{"missing", 0, false, false, false, false},
		{"symlink", fs.ModeSymlink, true, false, true, true},
		{"junction", fs.ModeIrregular, true, false, true, true},
		{"dangling symlink", fs.ModeSymlink, true, true, false, true},
		{"dangling junction", fs.ModeIrregular, true, true, false, true},
		{"plain directory", fs.ModeDir, true, false, false, false},
		{"file", 0, true, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mfs := newMemFS().add(abs("/k"), fs.ModeDir, "")
			if !tc.dangling {
				mfs.add(abs("/data"), fs.ModeDir, "")
			}
			if tc.exists {
				mfs.add(target, tc.mode, abs("/data"))
			}
			m := newLinkMounter(mfs, nil)
			if got, err := m.IsMountPoint(root, target); got != tc.mounted || err != nil {
				t.Errorf("IsMountPoint = %v, %v; want %v", got, err, tc.mounted)
			}
			if err := m.Unmount(root, target); err != nil {
				t.Fatalf("Unmount: %v", err)
			}
			_, err := mfs.Lstat(target)
			if removed := tc.exists && err != nil; removed != tc.wantRemoved {
				t.Errorf("removed = %v, want %v (calls %v)", removed, tc.wantRemoved, mfs.calls)
			}
			if slices.ContainsFunc(mfs.calls, func(c string) bool { return strings.Contains(c, "data") }) {
				t.Errorf("touched the data behind the link: %v", mfs.calls)
			}
		})
	}
}

func TestLinkMakeAndRemoveTarget(t *testing.T) {
	root := abs("/k")
	mfs := newMemFS().add(root, fs.ModeDir, "").add(abs("/k/pods"), fs.ModeDir, "").
		add(abs("/k/pods/u"), fs.ModeDir, "").
		add(abs("/k/pods/link"), fs.ModeSymlink, abs("/elsewhere")).
		add(abs("/k/pods/junction"), fs.ModeIrregular, "").
		add(abs("/k/pods/file"), 0, "").
		add(abs("/k/pods/u/t"), fs.ModeSymlink, abs("/data"))
	m := newLinkMounter(mfs, nil)

	if err := m.MakeTarget(root, abs("/k/pods/u/new")); err != nil {
		t.Errorf("MakeTarget: %v", err)
	}
	if _, err := mfs.Lstat(abs("/k/pods/u/new")); err == nil {
		t.Errorf("MakeTarget created the target; Windows links need it absent")
	}
	for _, tc := range []struct {
		target string
		want   error
	}{
		{abs("/k/pods/missing/t"), fs.ErrNotExist},
		{abs("/k/pods/link/t"), ErrSymlink},
		{abs("/k/pods/junction/t"), ErrSymlink},
		{abs("/k/pods/file/t"), errAny},
		{abs("/elsewhere/t"), errAny},
		{root, errAny},
	} {
		err := m.MakeTarget(root, tc.target)
		if err == nil || (tc.want != errAny && !errors.Is(err, tc.want)) {
			t.Errorf("MakeTarget(%s): %v, want %v", tc.target, err, tc.want)
		}
	}

	// RemoveTarget: the link only; missing is nil; never through a link.
	if err := m.RemoveTarget(root, abs("/k/pods/u/t")); err != nil {
		t.Errorf("RemoveTarget(link): %v", err)
	}
	if err := m.RemoveTarget(root, abs("/k/pods/u/t")); err != nil {
		t.Errorf("RemoveTarget(missing): %v", err)
	}
	if err := m.RemoveTarget(root, abs("/k/pods/nope/t")); err != nil {
		t.Errorf("RemoveTarget(missing parent): %v", err)
	}
	if err := m.RemoveTarget(root, abs("/k/pods/link/t")); !errors.Is(err, ErrSymlink) {
		t.Errorf("RemoveTarget through a link: %v, want ErrSymlink", err)
	}
	if err := m.RemoveTarget(root, abs("/elsewhere/t")); err == nil {
		t.Errorf("RemoveTarget outside root succeeded")
	}
	// A non-empty directory is not ours (MakeTarget made nothing, Mount refused
	// it): left alone, no error.
	mfs.add(abs("/k/pods/u/full"), fs.ModeDir, "").add(abs("/k/pods/u/full/f"), 0, "")
	if err := m.RemoveTarget(root, abs("/k/pods/u/full")); err != nil {
		t.Errorf("RemoveTarget(non-empty dir): %v", err)
	}
	if _, err := mfs.Lstat(abs("/k/pods/u/full/f")); err != nil {
		t.Errorf("RemoveTarget touched a non-empty directory: %v", err)
	}
	if want := []string{"remove " + abs("/k/pods/u/t")}; !slices.Equal(mfs.calls, want) {
		t.Errorf("calls %q, want %q", mfs.calls, want)
	}
}

func TestLinkSetReadOnly(t *testing.T) {
	if err := newLinkMounter(newMemFS(), nil).SetReadOnly(abs("/k"), abs("/k/t"), true); !errors.Is(err, ErrNotSupported) {
		t.Errorf("SetReadOnly: %v, want ErrNotSupported", err)
	}
}

// The same logic on the real filesystem of the host (POSIX symlinks on Linux).
func TestLinkMounterOS(t *testing.T) {
	root := t.TempDir()
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(root, "mount")
	if err := os.Mkdir(target, 0o750); err != nil { // as the kubelet does
		t.Fatal(err)
	}
	m := newLinkMounter(osFS{}, nil)
	if err := m.MakeTarget(root, target); err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(root, api.Source{Path: data}, target); err != nil {
		if os.IsPermission(err) {
			t.Skipf("no privilege to create symlinks: %v", err)
		}
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "x" {
		t.Fatalf("read through link: %q, %v", b, err)
	}
	if err := m.Mount(root, api.Source{Path: data}, target); err != nil {
		t.Errorf("second Mount of the same source: %v", err)
	}
	if ok, err := m.IsMountPoint(root, target); !ok || err != nil {
		t.Errorf("IsMountPoint = %v, %v", ok, err)
	}
	if err := m.Unmount(root, target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(data, "f")); err != nil {
		t.Fatalf("data gone after Unmount: %v", err)
	}
	if err := m.RemoveTarget(root, target); err != nil {
		t.Fatal(err)
	}

	// A link whose directory is gone is not published, is replaced by the next
	// Mount and removed by Unmount.
	gone := filepath.Join(t.TempDir(), "gone")
	if err := os.Symlink(gone, target); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.IsMountPoint(root, target); ok || err != nil {
		t.Errorf("IsMountPoint(dangling link) = %v, %v; want false", ok, err)
	}
	if err := m.Mount(root, api.Source{Path: data}, target); err != nil {
		t.Errorf("Mount over a dangling link: %v", err)
	}
	if dest, err := os.Readlink(target); err != nil || dest != data {
		t.Errorf("link after Mount: %q, %v; want %q", dest, err, data)
	}
	if err := m.Unmount(root, target); err != nil {
		t.Fatal(err)
	}

	full := filepath.Join(root, "full")
	if err := os.MkdirAll(filepath.Join(full, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(root, api.Source{Path: data}, full); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("Mount on a non-empty directory: %v, want ErrNotEmpty", err)
	}
}

// TestWindowsPathKey: how link destinations are compared on Windows (Readlink
// may return another spelling of the directory the link was made to).
func TestWindowsPathKey(t *testing.T) {
	const want = `c:\var\lib\ephemera\dir\v1`
	for _, in := range []string{
		`C:\var\lib\ephemera\dir\v1`,
		`c:\var\lib\ephemera\dir\v1`,
		`C:/var/lib/ephemera/dir/v1`,
		`C:\var/lib\ephemera/dir\v1`,
		`C:\VAR\Lib\Ephemera\DIR\V1`,
		`C:\var\lib\ephemera\dir\v1\`,
		`C:\var\lib\ephemera\dir\v1\\`,
		`C:\var\\lib\ephemera\\dir\v1`,
		`\var\lib\ephemera\dir\v1`,
		`/var/lib/ephemera/dir/v1`,
		`\\?\C:\var\lib\ephemera\dir\v1`,
		`\\?\c:\var\lib\ephemera\dir\v1\`,
		`\??\C:\var\lib\ephemera\dir\v1`,
		`//?/C:/var/lib/ephemera/dir/v1`,
	} {
		if got := winpath.Key(in); got != want {
			t.Errorf("winpath.Key(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		`C:\`:                        `c:\`,
		`C:`:                         `c:`,
		`\\server\share\dir\`:        `\\server\share\dir`,
		`\\?\UNC\server\share\dir`:   `\\server\share\dir`,
		`\\?\unc\Server\Share`:       `\\server\share`,
		`D:\var\lib\ephemera\dir\v1`: `d:\var\lib\ephemera\dir\v1`,
		``:                           ``,
	} {
		if got := winpath.Key(in); got != want {
			t.Errorf("winpath.Key(%q) = %q, want %q", in, got, want)
		}
	}
	for _, tc := range []struct {
		dest, dir string
		windows   bool
		same      bool
	}{
		{`\\?\C:\var\lib\ephemera\dir\v1\`, `c:\var\lib\ephemera\dir\v1`, true, true},
		{`C:\var\lib\ephemera\dir\v1`, `D:\var\lib\ephemera\dir\v1`, true, false},
		{`C:\var\lib\ephemera\dir\v1`, `C:\var\lib\ephemera\dir\v10`, true, false},
		{"/data/v1/", "/data/v1", false, true},
		{"/data/V1", "/data/v1", false, false},
		{"/", "/", false, true},
	} {
		if got := sameLinkTarget(tc.dest, tc.dir, tc.windows); got != tc.same {
			t.Errorf("sameLinkTarget(%q, %q, %v) = %v", tc.dest, tc.dir, tc.windows, got)
		}
	}
}
