package dir_test

import (
	"path/filepath"
	"testing"

	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/backendtest"
)

func TestBackendConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		b, err := dir.New(dir.Options{Root: filepath.Join(t.TempDir(), "volumes")})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, backendtest.Options{Mount: true})
}
