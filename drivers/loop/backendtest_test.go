//go:build linux

package loop_test

import (
	"path/filepath"
	"testing"

	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/backendtest"
)

func newLoop(t *testing.T) framework.Backend {
	b, err := loop.New(loop.Options{Dir: filepath.Join(t.TempDir(), "loop")})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBackendConformanceExt4(t *testing.T) {
	backendtest.Run(t, newLoop, backendtest.Options{
		Params: map[string]string{"size": "16Mi"},
		Size:   16 << 20,
		FSType: "ext4",
		Mount:  true,
	})
}

func TestBackendConformanceXFS(t *testing.T) {
	if testing.Short() {
		t.Skip("xfs needs 300Mi volumes")
	}
	backendtest.Run(t, newLoop, backendtest.Options{
		Params: map[string]string{"size": "300Mi", "fsType": "xfs"},
		Size:   300 << 20,
		FSType: "xfs",
		Mount:  true,
	})
}
