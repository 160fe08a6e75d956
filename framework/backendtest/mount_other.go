//go:build !linux

package backendtest

import (
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

func canMount() (bool, string) {
	return false, "mounting is only checked on Linux"
}

// The functions below are unreachable: requireMount skips first.

func (e *env) mount(t *testing.T, v *api.Volume, src api.Source) {
	t.Helper()
	t.Skip("mounting is only checked on Linux")
}

func (e *env) unmount(t *testing.T, target string) {
	t.Helper()
	t.Skip("mounting is only checked on Linux")
}

func (e *env) checkMounted(t *testing.T, target string, src api.Source) {}

func unmountLeftovers(t *testing.T, dir string) {}

func isNoSpace(err error) bool { return false }
