package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ulikunitz/xz"
)

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"2.36-9+deb12u14", "2.36-9+deb12u9", 1},
		{"2.36-9+deb12u10", "2.36-9+deb12u10", 0},
		{"1.47.0-2+b2", "1.47.0-2", 1},
		{"1.0~rc1-1", "1.0-1", -1},
		{"1:0.9-1", "2.0-1", 1},
		{"6.1.0-1", "6.10.0-1", -1},
		{"55-1", "55-1.1", -1},
		{"1.0a-1", "1.0-1", 1},
		{"1.0+b1", "1.0", 1},
	} {
		if got := compareVersions(c.a, c.b); got != c.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := compareVersions(c.b, c.a); got != -c.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", c.b, c.a, got, -c.want)
		}
	}
}

// makeTar writes a tar of the given entries, in the given (unsorted) order.
func makeTar(t *testing.T, entries []debEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: "./" + e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Linkname, Size: int64(len(e.Data)), ModTime: time.Now()}
		if e.Type == tar.TypeLink {
			h.Linkname = "./" + e.Linkname
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func xzBytes(t *testing.T, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := xz.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// makeDeb builds a .deb the way dpkg-deb does: an ar archive of debian-binary,
// control.tar.xz and data.tar.xz.
func makeDeb(t *testing.T, control string, entries []debEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteString("!<arch>\n")
	member := func(name string, data []byte) {
		fmt.Fprintf(&buf, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", name, 0, 0, 0, "100644", len(data))
		buf.Write(data)
		if len(data)%2 == 1 {
			buf.WriteByte('\n')
		}
	}
	member("debian-binary", []byte("2.0\n"))
	member("control.tar.xz", xzBytes(t, makeTar(t, []debEntry{{Name: "control", Type: tar.TypeReg, Mode: 0o644, Data: []byte(control)}})))
	member("data.tar.xz", xzBytes(t, makeTar(t, entries)))
	return buf.Bytes()
}

func TestParseDebAndAddDeb(t *testing.T) {
	control := "Package: e2fsprogs\nVersion: 1.47.0-2+b2\nArchitecture: amd64\n"
	data := makeDeb(t, control, []debEntry{
		{Name: "sbin", Type: tar.TypeDir, Mode: 0o755},
		{Name: "sbin/mke2fs", Type: tar.TypeReg, Mode: 0o755, Data: []byte("ELF mke2fs")},
		{Name: "sbin/mkfs.ext4", Type: tar.TypeLink, Linkname: "sbin/mke2fs"},
		{Name: "sbin/debugfs", Type: tar.TypeReg, Mode: 0o755, Data: []byte("ELF debugfs")},
		{Name: "sbin/e2fsck", Type: tar.TypeReg, Mode: 0o755, Data: []byte("left out")},
		{Name: "etc/mke2fs.conf", Type: tar.TypeReg, Mode: 0o644, Data: []byte("[defaults]\n")},
		{Name: "usr/share/doc/e2fsprogs/copyright", Type: tar.TypeReg, Mode: 0o644, Data: []byte("GPL")},
		{Name: "usr/share/man/man8/mke2fs.8.gz", Type: tar.TypeReg, Mode: 0o644, Data: []byte("man")},
	})
	d, err := parseDeb(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := controlField(d.Control, "Version"); got != "1.47.0-2+b2" {
		t.Fatalf("Version %q", got)
	}
	tr := newTree()
	if err := addDeb(tr, debPackage{Name: "e2fsprogs", Files: []string{"sbin/mke2fs", "sbin/mkfs.ext4", "sbin/debugfs", "etc/mke2fs.conf"}}, d); err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range tr.entries {
		names = append(names, n)
	}
	want := map[string]string{
		"sbin/mke2fs": "ELF mke2fs", "sbin/mkfs.ext4": "ELF mke2fs", "sbin/debugfs": "ELF debugfs",
		"etc/mke2fs.conf": "[defaults]\n", "usr/share/doc/e2fsprogs/copyright": "GPL",
	}
	if len(tr.entries) != len(want) {
		t.Fatalf("entries %v, want the %d of %v", names, len(want), want)
	}
	for n, content := range want {
		e, ok := tr.entries[n]
		if !ok || e.Type != tar.TypeReg || string(e.Data) != content {
			t.Errorf("%s: %+v, want a file of %q (a hard link becomes a copy)", n, e, content)
		}
	}

	// A package without a listed file is refused with its name.
	d.Entries = d.Entries[:1]
	if err := addDeb(newTree(), debPackage{Name: "e2fsprogs", Files: []string{"sbin/mke2fs", "sbin/mkfs.ext4", "sbin/debugfs", "etc/mke2fs.conf"}}, d); err == nil || !strings.Contains(err.Error(), "sbin/mke2fs: not in package e2fsprogs") {
		t.Fatalf("addDeb without the files: %v", err)
	}
	if _, err := parseDeb([]byte("!<arch>\n")); err == nil {
		t.Fatal("an empty ar archive parsed as a .deb")
	}
}

func TestTreeTarIsCanonical(t *testing.T) {
	epoch := time.Unix(1700000000, 0)
	mk := func(order []int) []byte {
		files := []debEntry{
			{Name: "usr/lib/x/libz.so.1", Type: tar.TypeSymlink, Linkname: "libz.so.1.2"},
			{Name: "usr/lib/x/libz.so.1.2", Type: tar.TypeReg, Mode: 0o644, Data: []byte("z")},
			{Name: "etc/a-b", Type: tar.TypeReg, Mode: 0o644, Data: []byte("ab")},
			{Name: "etc/a/b", Type: tar.TypeReg, Mode: 0o600, Data: []byte("b")},
		}
		tr := newTree()
		for _, i := range order {
			if err := tr.add(files[i]); err != nil {
				t.Fatal(err)
			}
		}
		data, err := tr.tar(epoch)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	a, b := mk([]int{0, 1, 2, 3}), mk([]int{3, 1, 2, 0})
	if !bytes.Equal(a, b) {
		t.Fatal("the same tree added in another order gives another tar")
	}
	var names []string
	err := walkTar(bytes.NewReader(a), func(h *tar.Header, _ io.Reader) error {
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 {
			return fmt.Errorf("%s: mtime %v uid %d gid %d", h.Name, h.ModTime, h.Uid, h.Gid)
		}
		names = append(names, h.Name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Sorted by path ('-' sorts before '/'), each directory before what it holds.
	want := "etc/ etc/a/ etc/a-b etc/a/b usr/ usr/lib/ usr/lib/x/ usr/lib/x/libz.so.1 usr/lib/x/libz.so.1.2"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("tar entries %s, want %s", got, want)
	}
	if err := newTree().add(debEntry{Name: "x", Type: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tr := newTree()
	_ = tr.file("x", 0o644, []byte("1"))
	if err := tr.file("x", 0o644, []byte("2")); err == nil {
		t.Fatal("two packages' different files at one path were merged")
	}
}

func TestPinsRoundTrip(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pins")
	in := []pin{
		{Arch: "arm64", Package: "libc6", Version: "2.36-9+deb12u14", SHA256: strings.Repeat("ab", 32), Size: 10, Filename: "pool/main/g/glibc/libc6_2.36-9+deb12u14_arm64.deb", Deps: []string{"libgcc-s1", "zz"}},
		{Arch: "amd64", Package: "libc6", Version: "2.36-9+deb12u14", SHA256: strings.Repeat("cd", 32), Size: 11, Filename: "pool/main/g/glibc/libc6_2.36-9+deb12u14_amd64.deb", Deps: []string{}},
	}
	if err := writePins(file, in); err != nil {
		t.Fatal(err)
	}
	out, err := readPins(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Arch != "amd64" || out[0].Deps == nil || len(out[0].Deps) != 0 ||
		out[1].SHA256 != strings.Repeat("ab", 32) || strings.Join(out[1].Deps, " ") != "libgcc-s1 zz" {
		t.Fatalf("read back %+v", out)
	}
	if err := os.WriteFile(file, []byte("amd64 libc6 1 xyz 10 pool/x.deb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readPins(file); err == nil || !strings.Contains(err.Error(), "not 64 hex digits") {
		t.Fatalf("a bad sha256 read as %v", err)
	}
}

// TestFetchDeb: a fetched .deb is checked and cached, a cached one is used without the
// mirror, a wrong one is refused, and a pin the mirror dropped says how to refresh.
func TestFetchDeb(t *testing.T) {
	body := []byte("a .deb")
	sum := sha256.Sum256(body)
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		switch r.URL.Path {
		case "/debian/pool/a.deb":
			_, _ = w.Write(body)
		case "/debian/pool/bad.deb":
			_, _ = w.Write([]byte("another"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	cache := t.TempDir()
	p := pin{Arch: "amd64", Package: "a", Version: "1", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(body)), Filename: "pool/a.deb"}
	for i := 0; i < 2; i++ {
		got, err := fetchDeb(srv.Client(), srv.URL+"/debian", cache, p)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("fetch %d: %q, %v", i, got, err)
		}
	}
	if hits != 1 {
		t.Fatalf("%d requests for one .deb fetched twice, want 1 (the cache)", hits)
	}
	bad := p
	bad.Filename = "pool/bad.deb"
	if _, err := fetchDeb(srv.Client(), srv.URL+"/debian", t.TempDir(), bad); err == nil || !strings.Contains(err.Error(), "refusing it") {
		t.Fatalf("a .deb of another sha256: %v", err)
	}
	gone := p
	gone.Filename = "pool/gone.deb"
	_, err := fetchDeb(srv.Client(), srv.URL+"/debian", t.TempDir(), gone)
	if !errors.Is(err, errGone) {
		t.Fatalf("a dropped version: %v, want errGone", err)
	}
}

// TestELFProblems: the DT_NEEDED check finds a missing library and interpreter, and
// is satisfied through symlinks once they are there (with this machine's mkfs.xfs and
// libraries as the ELF files).
func TestELFProblems(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Skipf("%v (the host's xfsprogs)", err)
		}
		return b
	}
	resolved := func(name string) string {
		p, err := filepath.EvalSymlinks(name)
		if err != nil {
			t.Skip(err)
		}
		return p
	}
	files := map[string]debEntry{"sbin/mkfs.xfs": {Name: "sbin/mkfs.xfs", Type: tar.TypeReg, Data: read("/sbin/mkfs.xfs")}}
	n, problems := elfProblems("amd64", files)
	if n != 1 || len(problems) < 2 || !strings.Contains(strings.Join(problems, "\n"), "DT_NEEDED libc.so.6 resolves nowhere") ||
		!strings.Contains(strings.Join(problems, "\n"), "interpreter /lib64/ld-linux-x86-64.so.2 not in the layer") {
		t.Fatalf("mkfs.xfs alone: %d ELF, problems %q", n, problems)
	}
	for _, lib := range []string{"libc.so.6", "libblkid.so.1", "libuuid.so.1", "libinih.so.1", "liburcu.so.8"} {
		real := resolved("/lib/x86_64-linux-gnu/" + lib)
		name := strings.TrimPrefix(real, "/")
		files[name] = debEntry{Name: name, Type: tar.TypeReg, Data: read(real)}
		if filepath.Base(real) != lib {
			files["lib/x86_64-linux-gnu/"+lib] = debEntry{Name: "lib/x86_64-linux-gnu/" + lib, Type: tar.TypeSymlink, Linkname: "/" + name}
		}
	}
	ld := strings.TrimPrefix(resolved("/lib64/ld-linux-x86-64.so.2"), "/")
	files[ld] = debEntry{Name: ld, Type: tar.TypeReg, Data: read("/" + ld)}
	files["lib64/ld-linux-x86-64.so.2"] = debEntry{Name: "lib64/ld-linux-x86-64.so.2", Type: tar.TypeSymlink, Linkname: "/" + ld}
	if n, problems := elfProblems("amd64", files); len(problems) != 0 {
		t.Fatalf("with its libraries (%d ELF files): %q", n, problems)
	}
	if _, problems := elfProblems("arm64", files); len(problems) == 0 {
		t.Fatal("amd64 files passed as arm64")
	}
}
