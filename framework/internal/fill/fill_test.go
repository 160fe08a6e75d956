package fill

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// mounter is a Mounter of the tests: a target is the real directory at its
// path (nothing is mounted); SetReadOnly is recorded, and fails with roErr.
type mounter struct {
	readOnly []bool
	roErr    error
}

func (m *mounter) OpenTarget(_, target string) (*os.Root, error) { return os.OpenRoot(target) }

func (m *mounter) SetReadOnly(_, _ string, readOnly bool) error {
	m.readOnly = append(m.readOnly, readOnly)
	return m.roErr
}

// refreshes records what Config.Refreshed hears.
type refreshes []error

func (r *refreshes) add(_ *api.Volume, err error) { *r = append(*r, err) }

// newFiller returns a Filler of p on lanes sized for it, with a content
// capacity of capacity bytes.
func newFiller(t *testing.T, p Providers, m Mounter, capacity int64, r *refreshes) (*Filler, *lanes.Lanes) {
	t.Helper()
	var backends []string
	for name := range p.Backends {
		backends = append(backends, name)
	}
	l, err := lanes.New(lanes.Options{
		Backends: backends, MaxInFlight: 4, MaxInFlightPerBackend: 4,
		ContentBytesInFlight: 1 << 20, ContentParties: p.Bounds(), RefreshConcurrency: 1,
		ContentCapacity: capacity, HeldParties: p.Parties(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{
		KubeletRootDir: "/unused", ContentTimeout: 10 * time.Second, Windows: runtime.GOOS == "windows",
		Providers: p, Mounter: m, Content: l.Content, Refresh: l.Refresh, Held: l.Held, Refreshed: r.add,
	}), l
}

// files are a small content answer.
func files(data string) map[string]api.File {
	return map[string]api.File{"a": {Data: []byte(data)}, "d/b": {Data: []byte(data + data)}}
}

// readFile reads name of the content at target.
func readFile(t *testing.T, target, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(target, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Fill gives the root to the fsGroup (group rwx, setgid) and writes the
// provider's files, the answer's bound reserved from the content budget
// only while it is in memory; a backend without content gets neither call.
func TestFill(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("fsGroup is Linux only")
	}
	cp := &bounded{provider: provider{files: files("x")}, max: 4096}
	p := Providers{Backends: map[string]Backend{"b": backend{x: cp, cp: cp}, "plain": backend{x: struct{}{}}}}
	f, l := newFiller(t, p, &mounter{}, lanes.NoContentCapacity, nil)
	gid := int64(os.Getgid())
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: t.TempDir(), FSGroup: &gid}
	if !f.Fills(v) || !f.Provides("b") || f.Provides("plain") || !f.Any() {
		t.Fatalf("Fills %v, Provides(b) %v, Provides(plain) %v, Any %v", f.Fills(v), f.Provides("b"), f.Provides("plain"), f.Any())
	}
	if err := f.Fill(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, v.TargetPath, "d/b"); got != "xx" {
		t.Errorf("d/b holds %q", got)
	}
	fi, err := os.Stat(v.TargetPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSetgid == 0 || fi.Mode().Perm()&0o070 != 0o070 {
		t.Errorf("root mode %v, want group rwx and setgid", fi.Mode())
	}
	if n := l.Content.InUse(); n != 0 {
		t.Errorf("%d bytes of the content budget still reserved after the write", n)
	}

	plain := &api.Volume{ID: "v2", Backend: "plain", TargetPath: filepath.Join(t.TempDir(), "never-opened")}
	if f.Fills(plain) {
		t.Error("Fills a volume without fsGroup or content")
	}
	if err := f.Fill(t.Context(), plain); err != nil {
		t.Errorf("Fill without anything to do: %v", err)
	}

	cp.err = errors.New("no secret")
	if err := f.Fill(t.Context(), v); err == nil || err.Error() != "content provider: no secret" {
		t.Errorf("a provider's failure: %v", err)
	}
	if got := readFile(t, v.TargetPath, "a"); got != "x" {
		t.Errorf("after a failed fill a holds %q, want the previous content", got)
	}
}

// Refresh swaps new content in, making a read-only volume writable for the
// swap only, and reports every end to Config.Refreshed; a failure keeps the
// previous content.
func TestRefresh(t *testing.T) {
	cp := &provider{files: files("1")}
	var got refreshes
	m := &mounter{}
	f, _ := newFiller(t, Providers{Content: cp, Backends: map[string]Backend{"b": backend{x: struct{}{}}}}, m, lanes.NoContentCapacity, &got)
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: t.TempDir(), ReadOnly: true}
	if err := f.Fill(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	cp.files = files("2")
	if err := f.Refresh(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, v.TargetPath, "a"); s != "2" {
		t.Errorf("after the refresh a holds %q", s)
	}
	if len(m.readOnly) != 2 || m.readOnly[0] || !m.readOnly[1] {
		t.Errorf("SetReadOnly calls %v, want [false true]", m.readOnly)
	}

	cp.err = errors.New("down")
	if err := f.Refresh(t.Context(), v); err == nil || err.Error() != "content provider: down" {
		t.Errorf("a failed refresh: %v", err)
	}
	if s := readFile(t, v.TargetPath, "a"); s != "2" {
		t.Errorf("after a failed refresh a holds %q, want the last good content", s)
	}
	cp.err, m.roErr = nil, errors.New("EROFS")
	if err := f.Refresh(t.Context(), v); err == nil || !strings.HasPrefix(err.Error(), "making volume writable for the refresh: ") {
		t.Errorf("a volume that stays read-only: %v", err)
	}
	if len(got) != 3 || got[0] != nil || got[1] == nil || got[2] == nil {
		t.Errorf("Refreshed heard %v, want [nil, failed, failed]", got)
	}
}

// records is a state store's List of the tests.
type records struct {
	recs []*store.Record
	err  error
}

func (r records) List(context.Context) ([]*store.Record, error) { return r.recs, r.err }

// memoryDir returns a directory in a memory-backed filesystem (/dev/shm), or
// skips the test.
func memoryDir(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("memory-backed volumes are Linux only")
	}
	dir, err := os.MkdirTemp("/dev/shm", "fill-test-")
	if err != nil {
		t.Skipf("no tmpfs at /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Content written into a memory-backed volume is charged to the content
// capacity (content.Charge) and replaced, not added to, by a refresh, which
// records what it holds (SaveHeld) before and after its write; a restart
// counts what the records of the published volumes say (CountHeld),
// skipping the ones not published, whatever the files in the volumes say.
func TestHeldContent(t *testing.T) {
	mem := memoryDir(t)
	cp := &provider{files: files("m")}
	p := Providers{Content: cp, Backends: map[string]Backend{"b": backend{x: struct{}{}}}}
	var r refreshes
	f, l := newFiller(t, p, &mounter{}, 64<<20, &r)
	var saved []int64
	f.cfg.SaveHeld = func(_ context.Context, _ *api.Volume, n int64) error {
		saved = append(saved, n)
		return nil
	}
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: mem}
	if err := f.Fill(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	page := l.Held.Page()
	want := content.Charge(cp.files, page)
	if n := l.Held.InUse(); n != want || !l.Held.Holds("v1") || len(saved) != 0 {
		t.Fatalf("held %d after the write (saved %v), want %d and nothing saved (the publish saves the record)", n, saved, want)
	}
	if err := f.Refresh(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if n := l.Held.InUse(); n != want || len(saved) != 0 {
		t.Errorf("held %d after a refresh of the same content (saved %v), want %d and nothing saved", n, saved, want)
	}
	cp.files = files("n")
	if err := f.Refresh(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if n := l.Held.InUse(); n != want || len(saved) != 2 || saved[0] != 2*want || saved[1] != want {
		t.Errorf("held %d after a refresh with new content (saved %v), want %d, and saved [%d %d]", n, saved, want, 2*want, want)
	}
	saved = nil
	f.cfg.SaveHeld = func(context.Context, *api.Volume, int64) error { return errors.New("store down") }
	cp.files = files("o")
	if err := f.Refresh(t.Context(), v); err == nil || !strings.Contains(err.Error(), "store down") {
		t.Errorf("a refresh whose charge cannot be recorded: %v, want the store's error", err)
	}
	if s := readFile(t, mem, "a"); s != "n" || l.Held.InUse() != want {
		t.Errorf("after a refresh that could not record its charge a holds %q and %d are held, want the last good content and %d", s, l.Held.InUse(), want)
	}
	disk := t.TempDir()
	if err := f.Fill(t.Context(), &api.Volume{ID: "v2", Backend: "b", TargetPath: disk}); err != nil {
		t.Fatal(err)
	}
	if l.Held.Holds("v2") {
		t.Error("content on a disk is counted")
	}

	// What the pod writes into its volume is not the driver's content: a
	// directory named like it, with a sparse 1 TiB file.
	fake := filepath.Join(mem, "..2020_01_01_00_00_00.1")
	if err := os.Mkdir(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, "blob"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(fake, "blob"), 1<<40); err != nil {
		t.Fatal(err)
	}

	// A restart: a new Filler counts what the records say.
	f2, l2 := newFiller(t, p, &mounter{}, 64<<20, &r)
	n1, n0 := want, int64(0)
	f2.CountHeld(t.Context(), records{recs: []*store.Record{
		{VolumeID: "v1", Backend: "b", Phase: store.PhasePublished, TargetPath: mem, ContentHeld: &n1},
		{VolumeID: "v2", Backend: "b", Phase: store.PhasePublished, TargetPath: disk, ContentHeld: &n0},
		{VolumeID: "gone", Backend: "b", Phase: store.PhasePublished, TargetPath: filepath.Join(mem, "gone")},
		{VolumeID: "intent", Backend: "b", Phase: store.PhasePublishing, TargetPath: mem, ContentHeld: &n1},
	}})
	if n := l2.Held.InUse(); n != want || !l2.Held.Holds("v1") || l2.Held.Holds("intent") {
		t.Errorf("counted %d at startup (v1 %v, intent %v), want %d of v1 only", n, l2.Held.Holds("v1"), l2.Held.Holds("intent"), want)
	}
	f3, l3 := newFiller(t, p, &mounter{}, 64<<20, &r)
	f3.CountHeld(t.Context(), records{err: errors.New("store down")})
	if n := l3.Held.InUse(); n != 0 {
		t.Errorf("counted %d from a store that cannot list", n)
	}
}
