//go:build unix

package content_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

func TestModesIgnoreUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	files := map[string]api.File{
		"ro":       {Data: []byte("r"), Mode: 0o400},
		"exec":     {Data: []byte("#!/bin/sh\n"), Mode: 0o755},
		"default":  {Data: []byte("d")},
		"sub/file": {Data: []byte("s"), Mode: 0o640},
	}
	write(t, dir, files)
	checkRead(t, dir, files)
	ts, _ := content.Current(dir)
	want := map[string]os.FileMode{"ro": 0o400, "exec": 0o755, "default": 0o644, "sub/file": 0o640, "sub": 0o755 | os.ModeDir, ".": 0o755 | os.ModeDir}
	for name, mode := range want {
		fi, err := os.Lstat(filepath.Join(dir, ts, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s mode = %v, want %v", name, fi.Mode(), mode)
		}
	}
}

func TestGID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	const gid = 4321
	group, other := int64(gid), int64(gid+1)
	dir := t.TempDir()
	files := map[string]api.File{"a": {Data: []byte("a"), Mode: 0o600}, "conf/b": {Data: []byte("b")}}
	if err := content.Write(t.Context(), dir, files, content.Options{FSGroup: &group}); err != nil {
		t.Fatal(err)
	}
	ts, _ := content.Current(dir)
	for name, mode := range map[string]os.FileMode{
		ts:              0o755 | os.ModeDir,
		ts + "/conf":    0o755 | os.ModeDir,
		ts + "/a":       0o640,
		ts + "/conf/b":  0o644,
		content.DataDir: 0o777 | os.ModeSymlink,
		"a":             0o777 | os.ModeSymlink,
		"conf":          0o777 | os.ModeSymlink,
	} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if g := fi.Sys().(*syscall.Stat_t).Gid; g != gid {
			t.Errorf("%s gid = %d, want %d", name, g, gid)
		}
		if fi.Mode() != mode {
			t.Errorf("%s mode = %v, want %v", name, fi.Mode(), mode)
		}
	}
	// Same set and gid: no swap. Different gid: swap.
	if err := content.Write(t.Context(), dir, files, content.Options{FSGroup: &group}); err != nil {
		t.Fatal(err)
	}
	if ts2, _ := content.Current(dir); ts2 != ts {
		t.Errorf("identical Write with gid swapped")
	}
	if err := content.Write(t.Context(), dir, files, content.Options{FSGroup: &other}); err != nil {
		t.Fatal(err)
	}
	if ts2, _ := content.Current(dir); ts2 == ts {
		t.Errorf("gid change did not swap")
	}
}
