package tmpfs_test

import (
	"testing"

	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/backendtest"
)

func TestBackendConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		return newBackend(t, tmpfs.Options{})
	}, backendtest.Options{
		Params: map[string]string{"size": "16Mi"},
		Size:   16 << 20,
		Mount:  true,
	})
}

// With fsType "tmpfs", the only fsType the backend accepts, the mounted
// filesystem is checked against it.
func TestBackendConformanceFSType(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		return newBackend(t, tmpfs.Options{DefaultSize: 8 << 20})
	}, backendtest.Options{
		Params: map[string]string{"mode": "0750"},
		Size:   8 << 20,
		FSType: "tmpfs",
		Mount:  true,
	})
}
