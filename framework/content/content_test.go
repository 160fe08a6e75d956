package content_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

var noGID = content.Options{}

func write(t *testing.T, dir string, files map[string]api.File) {
	t.Helper()
	if err := content.Write(t.Context(), dir, files, noGID); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

func file(s string) api.File { return api.File{Data: []byte(s)} }

// entries lists dir's top-level names, sorted.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func checkRead(t *testing.T, dir string, want map[string]api.File) {
	t.Helper()
	got, err := content.Read(dir)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("Read returned %d files, want %d: %v", len(got), len(want), keys(got))
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Fatalf("Read: %q missing", name)
		}
		if !bytes.Equal(g.Data, w.Data) {
			t.Errorf("Read %q = %q, want %q", name, g.Data, w.Data)
		}
		wm := w.Mode.Perm()
		if wm == 0 {
			wm = 0o644
		}
		if g.Mode != wm {
			t.Errorf("Read %q mode = %v, want %v", name, g.Mode, wm)
		}
		// Through the user-visible path too.
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil || !bytes.Equal(data, w.Data) {
			t.Errorf("reading %s through user-visible path = %q, %v; want %q", name, data, err, w.Data)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	files := map[string]api.File{
		"token":         file("secret"),
		"conf/app.ini":  file("[app]\n"),
		"conf/d/x.json": file("{}"),
		".hidden":       file("h"),
		"empty":         file(""),
	}
	write(t, dir, files)
	checkRead(t, dir, files)

	ts, err := content.Current(dir)
	if err != nil || !strings.HasPrefix(ts, "..") {
		t.Fatalf("Current = %q, %v", ts, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, content.DataDir)); err != nil || l != ts {
		t.Errorf("..data -> %q, %v; want %q", l, err, ts)
	}
	for _, top := range []string{"token", "conf", ".hidden", "empty"} {
		l, err := os.Readlink(filepath.Join(dir, top))
		if want := filepath.Join(content.DataDir, top); err != nil || l != want {
			t.Errorf("%s -> %q, %v; want %q", top, l, err, want)
		}
	}
	want := []string{".hidden", content.DataDir, ts, "conf", "empty", "token"}
	sort.Strings(want)
	if got := entries(t, dir); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dir holds %v, want %v", got, want)
	}
}

func TestReadEmpty(t *testing.T) {
	dir := t.TempDir()
	got, err := content.Read(dir)
	if err != nil || len(got) != 0 {
		t.Fatalf("Read of empty dir = %v, %v", got, err)
	}
	if ts, err := content.Current(dir); ts != "" || err != nil {
		t.Fatalf("Current of empty dir = %q, %v", ts, err)
	}
	// An empty set into a fresh directory creates nothing.
	write(t, dir, nil)
	if got := entries(t, dir); len(got) != 0 {
		t.Fatalf("empty Write created %v", got)
	}
}

func TestUpdate(t *testing.T) {
	dir := t.TempDir()
	// A file the pod created itself must survive.
	if err := os.WriteFile(filepath.Join(dir, "pod-owned"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, dir, map[string]api.File{"a": file("1"), "b": file("1"), "conf/x": file("1")})
	ts1, _ := content.Current(dir)

	set2 := map[string]api.File{"a": file("2"), "c": file("2")}
	write(t, dir, set2)
	ts2, _ := content.Current(dir)
	if ts1 == ts2 {
		t.Fatalf("timestamped dir not replaced: %s", ts2)
	}
	checkRead(t, dir, set2)
	for _, gone := range []string{"b", "conf", ts1} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still present after update: %v", gone, err)
		}
	}
	want := []string{content.DataDir, ts2, "a", "c", "pod-owned"}
	sort.Strings(want)
	if got := entries(t, dir); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dir holds %v, want %v", got, want)
	}

	// Empty set: everything of ours goes, the layout stays.
	write(t, dir, map[string]api.File{})
	checkRead(t, dir, nil)
	if got := entries(t, dir); len(got) != 3 {
		t.Errorf("after empty update dir holds %v", got)
	}
}

func TestIdempotent(t *testing.T) {
	dir := t.TempDir()
	files := map[string]api.File{"a": file("1"), "d/b": {Data: []byte("2"), Mode: 0o600}}
	write(t, dir, files)
	ts1, _ := content.Current(dir)
	write(t, dir, files)
	if ts2, _ := content.Current(dir); ts2 != ts1 {
		t.Errorf("identical Write swapped %s -> %s", ts1, ts2)
	}
	// A removed user-visible link is repaired without a swap.
	if err := os.Remove(filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	write(t, dir, files)
	if ts2, _ := content.Current(dir); ts2 != ts1 {
		t.Errorf("repair swapped %s -> %s", ts1, ts2)
	}
	checkRead(t, dir, files)

	// A mode change alone, extra files, or changed bytes force a swap.
	for _, change := range []func(map[string]api.File){
		func(m map[string]api.File) { m["d/b"] = api.File{Data: []byte("2"), Mode: 0o640} },
		func(m map[string]api.File) { m["e"] = file("") },
		func(m map[string]api.File) { m["a"] = file("x") },
		func(m map[string]api.File) { delete(m, "e") },
	} {
		change(files)
		before, _ := content.Current(dir)
		write(t, dir, files)
		if after, _ := content.Current(dir); after == before {
			t.Errorf("changed set did not swap (%v)", keys(files))
		}
		checkRead(t, dir, files)
	}
}

func TestTimestampName(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 5, 1, 12, 30, 45, 0, time.UTC)
	if err := content.Write(t.Context(), dir, map[string]api.File{"a": file("1")}, content.Options{Now: func() time.Time { return now }}); err != nil {
		t.Fatal(err)
	}
	ts, _ := content.Current(dir)
	if !strings.HasPrefix(ts, "..2026_05_01_12_30_45.") {
		t.Errorf("timestamped dir = %q", ts)
	}
}

// TestConcurrentReader checks the atomicity guarantee: files a and b always hold
// the same counter. Resolving ..data once and reading both files through the
// resolved directory must never see a != b; reading a user-visible path must
// never see a partial or empty file.
func TestConcurrentReader(t *testing.T) {
	dir := t.TempDir()
	body := func(n int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("%08d\n", n)), 512) } // 4.5 KiB
	set := func(n int) map[string]api.File {
		return map[string]api.File{"a": {Data: body(n)}, "b": {Data: body(n)}, "conf/c": {Data: body(n)}}
	}
	write(t, dir, set(0))

	valid := func(data []byte) bool {
		if len(data) != 9*512 {
			return false
		}
		return bytes.Equal(data, bytes.Repeat(data[:9], 512))
	}
	var stop atomic.Bool
	var pairs, singles atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	wg.Add(2)
	go func() { // same-set reader
		defer wg.Done()
		for !stop.Load() {
			ts, err := os.Readlink(filepath.Join(dir, content.DataDir))
			if err != nil {
				report(fmt.Errorf("readlink ..data: %v", err)) // ..data must always exist
				return
			}
			a, errA := os.ReadFile(filepath.Join(dir, ts, "a"))
			b, errB := os.ReadFile(filepath.Join(dir, ts, "b"))
			if errA != nil || errB != nil {
				// The set was replaced and removed after the readlink: retry.
				if !errors.Is(errA, fs.ErrNotExist) && !errors.Is(errB, fs.ErrNotExist) {
					report(fmt.Errorf("reading pair: %v, %v", errA, errB))
					return
				}
				continue
			}
			if !valid(a) || !bytes.Equal(a, b) {
				report(fmt.Errorf("inconsistent pair: a=%.9q (%d bytes) b=%.9q (%d bytes)", a, len(a), b, len(b)))
				return
			}
			pairs.Add(1)
		}
	}()
	go func() { // user-visible single-file reader
		defer wg.Done()
		for !stop.Load() {
			for _, name := range []string{"a", "b", "conf/c"} {
				data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
				if err != nil {
					if errors.Is(err, fs.ErrNotExist) {
						continue // resolved ..data just before the old set was removed
					}
					report(fmt.Errorf("reading %s: %v", name, err))
					return
				}
				if !valid(data) {
					report(fmt.Errorf("partial %s: %d bytes", name, len(data)))
					return
				}
				singles.Add(1)
			}
		}
	}()
	for n := 1; n <= 200; n++ {
		if err := content.Write(t.Context(), dir, set(n), noGID); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("update %d: %v", n, err)
		}
	}
	// Let the readers see the final set too.
	for pairs.Load() == 0 || singles.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	t.Logf("%d consistent pairs, %d complete single reads", pairs.Load(), singles.Load())
	checkRead(t, dir, set(200))
	if got := entries(t, dir); len(got) != 5 { // ..data, ts, a, b, conf
		t.Errorf("leftovers after updates: %v", got)
	}
}

func TestInvalidNames(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		files map[string]api.File
	}{
		{"empty", map[string]api.File{"": file("x")}},
		{"absolute", map[string]api.File{"/etc/passwd": file("x")}},
		{"dotdot", map[string]api.File{"..": file("x")}},
		{"parent escape", map[string]api.File{"../x": file("x")}},
		{"inner dotdot", map[string]api.File{"a/../b": file("x")}},
		{"dot", map[string]api.File{".": file("x")}},
		{"leading dot slash", map[string]api.File{"./a": file("x")}},
		{"trailing slash", map[string]api.File{"a/": file("x")}},
		{"double slash", map[string]api.File{"a//b": file("x")}},
		{"reserved ..data", map[string]api.File{"..data": file("x")}},
		{"reserved ..data_tmp", map[string]api.File{"..data_tmp": file("x")}},
		{"reserved nested", map[string]api.File{"conf/..hidden": file("x")}},
		{"reserved timestamp", map[string]api.File{"..2026_01_01_00_00_00.1/a": file("x")}},
		{"backslash", map[string]api.File{`a\b`: file("x")}},
		{"NUL", map[string]api.File{"a\x00b": file("x")}},
		{"file and dir", map[string]api.File{"conf": file("x"), "conf/app.ini": file("y")}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			dir := t.TempDir()
			tc.files["valid"] = file("ok") // must not be written either
			err := content.Write(t.Context(), dir, tc.files, noGID)
			if !errors.Is(err, api.ErrInvalidParams) {
				t.Fatalf("Write = %v, want ErrInvalidParams", err)
			}
			if got := entries(t, dir); len(got) != 0 {
				t.Errorf("invalid Write left %v", got)
			}
		})
	}
}

// TestPlantedLinks plants links pointing outside the volume under every name
// Write touches; nothing outside may be written, chmod'ed or removed.
func TestPlantedLinks(t *testing.T) {
	outside := t.TempDir()
	sentinel := filepath.Join(outside, "sentinel")
	if err := os.WriteFile(sentinel, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(outside, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"conf", "token", content.DataDir, "..data_tmp", "..2020_01_01_00_00_00.1"} {
		if err := os.Symlink(outside, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A planted real directory under a user-visible name is replaced too.
	if err := os.MkdirAll(filepath.Join(dir, "d", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]api.File{"conf/app.ini": file("ini"), "token": {Data: []byte("t"), Mode: 0o777}, "d/f": file("f")}
	write(t, dir, files)
	checkRead(t, dir, files)

	ents, err := os.ReadDir(outside)
	if err != nil || len(ents) != 1 {
		t.Fatalf("outside dir holds %v, %v", ents, err)
	}
	fi, err := os.Stat(sentinel)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("sentinel changed: %v, %v", fi, err)
	}
	if fi, _ := os.Stat(outside); fi.Mode().Perm() != 0o700 {
		t.Errorf("outside dir mode changed to %v", fi.Mode())
	}
	for _, name := range []string{"conf", "token", "d"} {
		if l, err := os.Readlink(filepath.Join(dir, name)); err != nil || l != filepath.Join(content.DataDir, name) {
			t.Errorf("%s -> %q, %v", name, l, err)
		}
	}
	// The planted timestamp-looking link was not followed by cleanup.
	if _, err := os.Lstat(filepath.Join(dir, "..2020_01_01_00_00_00.1")); err != nil {
		t.Errorf("planted link removed or followed: %v", err)
	}

	// A ..data planted between writes (pointing outside) is replaced, and
	// Current refuses it meanwhile.
	if err := os.Remove(filepath.Join(dir, content.DataDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, content.DataDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := content.Current(dir); err == nil {
		t.Error("Current accepted ..data pointing outside")
	}
	if _, err := content.Read(dir); err == nil {
		t.Error("Read accepted ..data pointing outside")
	}
	write(t, dir, files)
	checkRead(t, dir, files)
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("outside dir holds %v", ents)
	}
}

func BenchmarkWrite10x1KiB(b *testing.B) {
	dir := b.TempDir()
	sets := [2]map[string]api.File{{}, {}}
	for i := range 10 {
		sets[0][fmt.Sprintf("f%d", i)] = api.File{Data: bytes.Repeat([]byte{'a'}, 1024)}
		sets[1][fmt.Sprintf("f%d", i)] = api.File{Data: bytes.Repeat([]byte{'b'}, 1024)}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := content.Write(b.Context(), dir, sets[i%2], noGID); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkWriteUnchanged10x1KiB(b *testing.B) {
	dir := b.TempDir()
	set := map[string]api.File{}
	for i := range 10 {
		set[fmt.Sprintf("f%d", i)] = api.File{Data: bytes.Repeat([]byte{'a'}, 1024)}
	}
	if err := content.Write(b.Context(), dir, set, noGID); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := content.Write(b.Context(), dir, set, noGID); err != nil {
			b.Fatal(err)
		}
	}
}
