//go:build linux

package crash

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/framework/failpoint"
)

var (
	// skipReason, when set, makes every test skip (not root).
	skipReason string
	// driverBin is the scratch driver built with -tags failpoints.
	driverBin string
	// publishFailpoints and unpublishFailpoints are every side-effect boundary
	// of the framework's publish and unpublish, in order.
	publishFailpoints, unpublishFailpoints = failpoint.Publish, failpoint.Unpublish
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		skipReason = "crash tests need root: they mount tmpfs and bind mounts and kill the driver with SIGKILL (run: sudo go test ./test/crash/)"
		return m.Run()
	}
	repo, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash:", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "crash-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	driverBin = filepath.Join(tmp, "scratch")
	// Built as make builds everything but the -race tests (CGO_ENABLED=0, -trimpath,
	// the tags of its GOTAGS, exported as EPHEMERA_GOTAGS), so that the packages the
	// failpoints tag does not change are build cache hits.
	tags := "failpoints"
	if t := os.Getenv("EPHEMERA_GOTAGS"); t != "" {
		tags = t + ",failpoints"
	}
	build := exec.Command("go", "build", "-trimpath", "-tags", tags, "-o", driverBin, "./drivers/scratch")
	build.Dir = repo
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "crash: building the scratch driver with failpoints: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// repoRoot is the directory of the module's go.mod.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}
