package backendtest_test

import (
	"path/filepath"
	"testing"

	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/backendtest"
)

// testDirBackend is what a driver author writes in a _test.go file of the
// backend's package, named TestBackendConformance there. Run it as root (or in
// CI as root) so that the subtests that mount are not skipped.
func testDirBackend(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		// A fresh backend per subtest, its storage in the subtest's TempDir.
		b, err := dir.New(dir.Options{Root: filepath.Join(t.TempDir(), "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, backendtest.Options{
		// The dir backend takes no size; a sized backend would pass
		// Params: map[string]string{"size": "16Mi"} and Size: 16 << 20.
		Params: map[string]string{"mode": "0750"},
		Mount:  true,
	})
}

// A driver author runs the suite from a test function of the backend's package.
func Example() {
	// go test -race ./... runs TestBackendConformance; see testDirBackend.
	_ = testDirBackend
}
