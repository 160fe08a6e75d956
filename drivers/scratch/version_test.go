package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/drivers/scratch/internal/buildinfo"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

func TestPrintVersion(t *testing.T) {
	var out bytes.Buffer
	printVersion(&out, buildinfo.Info{Version: "v1.2.3", Commit: "abc123-dirty", BuildTime: "2026-01-02T03:04:05Z", GoVersion: "go1.26.8", Platform: "linux/amd64"})
	want := "ephemera-scratch v1.2.3\ngit commit: abc123-dirty\ncommit time: 2026-01-02T03:04:05Z\ngo: go1.26.8 linux/amd64\n" +
		fmt.Sprintf("state file: schema %d, records version 1\n", boltstore.SchemaVersion)
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	printVersion(&out, buildinfo.Info{Version: "dev", GoVersion: "go1.26.8", Platform: "linux/amd64"})
	if !strings.Contains(out.String(), "git commit: unknown") || strings.Contains(out.String(), "commit time") {
		t.Errorf("without VCS information:\n%s", out.String())
	}
	if b := readBuildInfo(); b.Version != version || b.GoVersion == "" || b.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("readBuildInfo() = %+v", b)
	}
}

// The built binary answers "version" and "--version" with the -ldflags
// version and the commit the toolchain stamped, and starts nothing.
func TestVersionCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "ephemera-scratch")
	// As the Makefile builds it where the toolchain stamps no VCS information.
	build := exec.Command("go", "build", "-buildvcs=false", "-tags", "grpcnotrace", "-ldflags", "-X main.version=v9.8.7 -X main.commit=0123abcd", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		s := string(out)
		if !strings.HasPrefix(s, "ephemera-scratch v9.8.7\ngit commit: 0123abcd\n") || !strings.Contains(s, "go: "+runtime.Version()) {
			t.Errorf("%v:\n%s", args, s)
		}
	}
}
