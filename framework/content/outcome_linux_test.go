//go:build linux

package content_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/mounttest"
)

// A Write that swapped the new files in and removed the previous ones, but
// could not link a top-level name, says so (ErrReplaced): of Write's, the
// new content is the only one left. One that could not remove the previous
// content says neither: both may be there.
func TestWriteReplacedOrNot(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]api.File{"x": file("1")})
	mounttest.Busy(t, filepath.Join(dir, "a"))
	err := content.Write(t.Context(), dir, map[string]api.File{"a": file("2")}, content.Options{Admit: func() error { return nil }})
	if err == nil || !errors.Is(err, content.ErrReplaced) || errors.Is(err, content.ErrRolledBack) {
		t.Fatalf("Write whose top-level name cannot be linked: %v, want ErrReplaced", err)
	}
	ts, err := content.Current(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := timestamped(t, dir); len(got) != 1 || got[0] != ts {
		t.Errorf("timestamped directories %q, want only the current %s", got, ts)
	}

	dir = t.TempDir()
	write(t, dir, map[string]api.File{"d/x": file("1")})
	old, err := content.Current(dir)
	if err != nil {
		t.Fatal(err)
	}
	mounttest.Busy(t, filepath.Join(dir, old, "d", "mnt"))
	err = content.Write(t.Context(), dir, map[string]api.File{"d/x": file("2")}, content.Options{Admit: func() error { return nil }})
	if err == nil || errors.Is(err, content.ErrReplaced) || errors.Is(err, content.ErrRolledBack) {
		t.Fatalf("Write that cannot remove the previous content: %v, want neither ErrReplaced nor ErrRolledBack", err)
	}
	if got := timestamped(t, dir); len(got) != 2 {
		t.Errorf("timestamped directories %q, want the previous and the new", got)
	}
}
