package plugin_test

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func isTmpfs(t *testing.T, p string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == unix.TMPFS_MAGIC
}

func isMountPoint(p string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(p), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}
