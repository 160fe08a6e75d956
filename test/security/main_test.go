//go:build linux

package security

import (
	"os"
	"testing"

	"github.com/ephemera-csi/ephemera/test/internal/hostile"
)

// TestMain serves a hostile plugin when this binary was re-executed as one
// (the bulkhead tests start them), is a tenant agent when it was re-executed
// as one (TestTenantActions' pods), and otherwise runs the tests and removes
// the driver binary they built.
func TestMain(m *testing.M) {
	if opts, ok := hostile.FromEnv(); ok {
		os.Exit(hostile.Main(opts))
	}
	if os.Getenv(envTenantAgent) != "" {
		os.Exit(tenantAgentMain())
	}
	code := m.Run()
	removeDriverBinary()
	os.Exit(code)
}
