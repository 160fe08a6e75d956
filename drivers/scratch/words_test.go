package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// optionsFields lists every field path of framework.Options ("Limits.MaxInFlight"),
// through nested structs: the Go words an operator must not be given.
func optionsFields() []string {
	var paths []string
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for f := range t.Fields() {
			if !f.IsExported() {
				continue
			}
			p := prefix + f.Name
			if prefix != "" {
				paths = append(paths, p) // top-level names alone (Backends, Content) are words too common to check
			}
			if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == t.PkgPath() {
				walk(p+".", f.Type)
			}
		}
	}
	walk("", reflect.TypeFor[framework.Options]())
	return append(paths, "DriverName", "Options.")
}

// goWords returns the Go words (Options fields) out names.
func goWords(out string) []string {
	var found []string
	for _, p := range optionsFields() {
		if strings.Contains(out, p) {
			found = append(found, p)
		}
	}
	return found
}

// TestOperatorWords walks the messages an operator gets from the driver's
// flags: every refusal of a bad flag value (the driver's own checks and
// framework.New's) names the flag and no Options field, and so do the startup
// logs of a driver without API access.
func TestOperatorWords(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ephemera-scratch")
	build := exec.Command("go", "build", "-buildvcs=false", "-tags", "grpcnotrace", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	base := []string{"--nodeid=node-1", "--state-dir=" + filepath.Join(dir, "state"), "--kubelet-root=" + filepath.Join(dir, "kubelet"),
		"--endpoint=unix://" + filepath.Join(dir, "csi.sock")}
	run := func(t *testing.T, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append(append([]string{}, base...), args...)...)
		cmd.Env = append(os.Environ(), "NODE_NAME=")
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("%v: still running after 20s (the flags were accepted):\n%s", args, out)
		}
		return string(out), err
	}
	for _, c := range []struct {
		args  []string
		flags []string // what the refusal must name
	}{
		{[]string{"--max-in-flight=-1"}, []string{"--max-in-flight"}},
		{[]string{"--max-in-flight-per-backend=1000"}, []string{"--max-in-flight-per-backend", "--max-in-flight"}},
		{[]string{"--max-in-flight=8", "--in-flight-reserved-per-backend=7"}, []string{"--in-flight-reserved-per-backend"}},
		{[]string{"--max-volumes-per-pod=-2"}, []string{"--max-volumes-per-pod"}},
		{[]string{"--max-volumes-per-node=-1"}, []string{"--max-volumes-per-node"}},
		{[]string{"--state-dir=relative"}, []string{"--state-dir"}},
		{[]string{"--kubelet-root=relative"}, []string{"--kubelet-root"}},
		{[]string{"--endpoint=tcp://127.0.0.1:1"}, []string{"--endpoint"}},
		{[]string{"--metrics-address=nonsense"}, []string{"--metrics-address"}},
		{[]string{"--gc-max-orphan-share=2"}, []string{"--gc-max-orphan-share"}},
		{[]string{"--operation-timeout=5m"}, []string{"--operation-timeout"}},
		{[]string{"--content-timeout=100s"}, []string{"--content-timeout", "--operation-timeout"}},
		{[]string{"--provision-timeout=2h"}, []string{"--provision-timeout", "--operation-timeout"}},
		{[]string{"--provision-timeout=1m"}, []string{"--provision-timeout", "--operation-timeout"}},
		{[]string{"--stats-max-depth=-1"}, []string{"--stats-max-depth"}},
		{[]string{"--stats-timeout=2m"}, []string{"--stats-timeout"}},
		{[]string{"--state-recovery=maybe"}, []string{"--state-recovery"}},
		{[]string{"--memory-limit=1Mi"}, []string{"--memory-limit"}},
		{[]string{"--backend=nope"}, []string{"--backend"}},
		{[]string{"--backends=tmpfs", "--backend=tmpfs", "--mount-options=loop=noexec"}, []string{"--mount-options"}},
		{[]string{"--driver-name=-bad-"}, []string{"--driver-name"}},
		{[]string{"--nodeid="}, []string{"--nodeid"}},
		{[]string{"--capacity=tmpfs=lots"}, []string{"--capacity"}},
		{[]string{"--capacity=nope=1Gi"}, []string{"--capacity"}},
		{[]string{"--max-volume-size=big"}, []string{"--max-volume-size"}},
		{[]string{"--tmpfs-max-inodes=0"}, []string{"--tmpfs-max-inodes"}},
		{[]string{"--windows-mode=sideways"}, []string{"--windows-mode"}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			out, err := run(t, c.args...)
			if err == nil {
				t.Fatalf("exit 0:\n%s", out)
			}
			for _, f := range c.flags {
				if !strings.Contains(out, f) {
					t.Errorf("the refusal does not name %s:\n%s", f, out)
				}
			}
			if w := goWords(out); len(w) > 0 {
				t.Errorf("the refusal names Options fields %v:\n%s", w, out)
			}
		})
	}

	// A driver that starts and stops: its startup logs (no API access: the
	// CSIDriver object is not checked) name flags too.
	t.Run("startup", func(t *testing.T) {
		cmd := exec.Command(bin, append(append([]string{}, base...), "--v=2")...)
		var out drivertest.SyncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		deadline := time.After(20 * time.Second)
	wait:
		for {
			select {
			case <-done:
				t.Fatalf("the driver exited:\n%s", out.String())
			case <-deadline:
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("no \"Serving CSI\" within 20s:\n%s", out.String())
			case <-time.After(50 * time.Millisecond):
				if _, err := os.Stat(filepath.Join(dir, "csi.sock")); err == nil && strings.Contains(out.String(), "Not checking the CSIDriver object") {
					break wait
				}
			}
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		s := out.String()
		if !strings.Contains(s, "no API access (--events or --gc-confirm-with-api not set)") {
			t.Errorf("the CSIDriver message does not name the flags:\n%s", s)
		}
		if w := goWords(s); len(w) > 0 {
			t.Errorf("the logs name Options fields %v:\n%s", w, s)
		}
	})
}
