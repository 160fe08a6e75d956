//go:build !linux

package plugin_test

import (
	"errors"
	"testing"
)

// These tests mount tmpfs volumes; elsewhere they compile (so an API change
// breaks the Windows build here, not on a Windows node) but do not run.

func isTmpfs(t *testing.T, _ string) bool {
	t.Helper()
	t.Skip("tmpfs: Linux only")
	return false
}

func isMountPoint(string) (bool, error) {
	return false, errors.New("mount points: Linux only")
}
