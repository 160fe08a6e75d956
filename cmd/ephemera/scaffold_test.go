package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestScaffoldBuilds is the proof that new's output works as written: for
// each kind it writes a module into a temporary directory against this
// checkout (-replace), which runs go mod tidy, then runs go vet ./... and
// go test ./... there, and requires every test to pass. As root the
// drivertest test mounts (a tmpfs, an ext4 on a loop device, a tmpfs for a
// plugin in its own process) and must pass, not skip. It shares the build
// and module caches of the caller's environment (GOFLAGS gets -mod=mod, the
// tags are the Makefile's, EPHEMERA_GOTAGS, and the flags its vet and
// static builds use, CGO_ENABLED=0 and -trimpath, so that the SDK's packages
// come from the build cache make vet filled); -short skips it.
func TestScaffoldBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three modules")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	root := checkout(t)
	env := append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod -trimpath"), "CGO_ENABLED=0")
	var tags []string
	if tg := os.Getenv("EPHEMERA_GOTAGS"); tg != "" {
		tags = []string{"-tags", tg}
	}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), kind+"demo")
			start := time.Now()
			// go mod tidy (run by new) inherits this process's environment.
			t.Setenv("GOFLAGS", strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"))
			code, out, errs := ephemera(t, "(devel)", "new", "-kind", kind, "-replace", root, "example.com/"+kind+"demo", dir)
			if code != 0 {
				t.Fatalf("ephemera new: exit %d\n%s%s", code, out, errs)
			}
			scaffolded := time.Since(start)
			goCmd := func(args ...string) string {
				t.Helper()
				cmd := exec.Command(goBin, args...)
				cmd.Dir, cmd.Env = dir, env
				b, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
				}
				return string(b)
			}
			goCmd(append([]string{"vet"}, append(tags, "./...")...)...)
			vetted := time.Since(start)
			testOut := goCmd(append([]string{"test", "-count=1", "-v"}, append(tags, "./...")...)...)
			for _, line := range strings.Split(testOut, "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "--- SKIP") && os.Geteuid() == 0 {
					t.Errorf("a test of the new module skipped as root: %s", line)
				}
			}
			if !strings.Contains(testOut, "--- PASS: TestPublish") {
				if os.Geteuid() == 0 {
					t.Errorf("TestPublish did not pass:\n%s", testOut)
				} else {
					t.Logf("not root: TestPublish skipped")
				}
			}
			t.Logf("%s: new (with go mod tidy) %v, go vet %v, go test %v", kind,
				scaffolded.Round(time.Millisecond), (vetted - scaffolded).Round(time.Millisecond), (time.Since(start) - vetted).Round(time.Millisecond))
		})
	}
}
