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
