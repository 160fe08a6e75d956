package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// fakeProc is a /proc with the processes of procs (pid → exe and command
// line), each exe a file of its own name in dir.
func fakeProc(t *testing.T, dir string, procs map[string][]string) string {
	t.Helper()
	root := filepath.Join(dir, "proc")
	for pid, cmdline := range procs {
		exe := filepath.Join(dir, filepath.Base(cmdline[0]))
		if _, err := os.Stat(exe); err != nil {
			if err := os.WriteFile(exe, []byte("#!/bin/false\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(exe, filepath.Join(root, pid, "exe")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "cmdline"), []byte(strings.Join(cmdline, "\x00")+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func noEnv(string) string { return "" }

// "volumes" without flags finds the driver it belongs to: the running driver
// of its own executable (its command line's flags), not other programs nor
// its own commands; among several, --driver-name chooses; then the
// environment; then `make run`'s layout beside the binary.
func TestVolumesFindsItsDriver(t *testing.T) {
	work := t.TempDir()
	fake := mount.NewFake()
	h := startVolumesDriver(t, fake, func(o *framework.Options) { o.Node.StateDir = filepath.Join(work, "state") })
	pod := h.Kubelet.NewPod("team-a", "web")
	vol := drivertest.InlineVolume{Name: "scratch"}
	fake.AddDir(filepath.Dir(h.Kubelet.TargetPath(pod, vol.Name)))
	if _, err := h.Node.NodePublishVolume(t.Context(), h.Kubelet.PublishRequest(pod, vol)); err != nil {
		t.Fatal(err)
	}
	addr := h.Driver().MetricsAddr()
	_, port, _ := strings.Cut(addr, ":")
	bin := filepath.Join(work, "bin", "ephemera-scratch")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	driverArgs := []string{bin, "--nodeid=node-1", "--state-dir", h.Options.Node.StateDir, "--kubelet-root=" + h.Options.Node.KubeletRootDir,
		"--metrics-address=:" + port, "--v=2", "--register"}
	procs := map[string][]string{
		"4242": driverArgs,
		"4243": {filepath.Join(work, "sh"), "--state-dir=/elsewhere"},  // another program
		"4244": {bin, "volumes", "--state-dir=/elsewhere"},             // a command of the binary
		"4245": {bin, "state", "dump", "--state-dir=/elsewhere"},       // another
		"4246": {filepath.Join(work, "other"), "--metrics-address=:1"}, // another binary
	}
	dir := t.TempDir()
	l := locator{procRoot: fakeProc(t, dir, procs), exe: bin, getenv: noEnv, self: 1, sameFile: os.SameFile}
	// The fake /proc's exe links point into dir: the binary is there.
	if err := os.Rename(filepath.Join(dir, "ephemera-scratch"), bin); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []string{"4242", "4244", "4245"} {
		link := filepath.Join(l.procRoot, pid, "exe")
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(bin, link); err != nil {
			t.Fatal(err)
		}
	}
	run := func(l locator, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := l.volumesCommand(append([]string{"--timeout", "300ms"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}

	code, stdout, stderr := run(l, "-v")
	if code != 0 || !strings.Contains(stderr, "found the driver of this binary: process 4242") || !strings.Contains(stderr, "from the running driver at 127.0.0.1:"+port) ||
		!strings.Contains(stdout, "team-a") || !strings.Contains(stderr, "--state-dir="+h.Options.Node.StateDir+" (from the command line of driver process 4242)") {
		t.Fatalf("the running driver: %d\n%s\n%s", code, stderr, stdout)
	}

	// Two drivers of the binary: the command asks which, and --driver-name chooses.
	two := t.TempDir()
	l2 := locator{procRoot: fakeProc(t, two, map[string][]string{"7": driverArgs, "8": {bin, "--driver-name=other.example.com", "--metrics-address=:1"}}), exe: bin, getenv: noEnv, sameFile: os.SameFile}
	for _, pid := range []string{"7", "8"} {
		link := filepath.Join(l2.procRoot, pid, "exe")
		_ = os.Remove(link)
		if err := os.Symlink(bin, link); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, stderr := run(l2); code != 1 || !strings.Contains(stderr, "2 drivers of this binary run") || !strings.Contains(stderr, "process 8: --driver-name other.example.com") {
		t.Errorf("two drivers: %d %q", code, stderr)
	}
	if code, stdout, stderr := run(l2, "--driver-name", DriverName); code != 0 || !strings.Contains(stderr, "process 7") || !strings.Contains(stdout, "team-a") {
		t.Errorf("two drivers, --driver-name: %d %q\n%s", code, stderr, stdout)
	}
	// A driver without --metrics-address: the command says why it cannot list.
	l3 := locator{procRoot: fakeProc(t, t.TempDir(), map[string][]string{"9": {bin, "--state-dir=" + h.Options.Node.StateDir}}), exe: bin, getenv: noEnv, sameFile: os.SameFile}
	_ = os.Remove(filepath.Join(l3.procRoot, "9", "exe"))
	if err := os.Symlink(bin, filepath.Join(l3.procRoot, "9", "exe")); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run(l3); code != 1 || !strings.Contains(stderr, "serves no --metrics-address") {
		t.Errorf("a driver without --metrics-address: %d %q", code, stderr)
	}

	// The environment, over what the driver's command line says.
	env := map[string]string{envAddress: "127.0.0.1:1", envStateDir: "/nowhere", envKubeletRoot: h.Options.Node.KubeletRootDir}
	le := l
	le.getenv = func(k string) string { return env[k] }
	if code, _, stderr := run(le, "-v"); code != 1 || !strings.Contains(stderr, "--state-dir=/nowhere (from $EPHEMERA_STATE_DIR)") || !strings.Contains(stderr, "no state file at /nowhere") {
		t.Errorf("environment: %d %q", code, stderr)
	}
	// Flags over the environment.
	if code, stdout, _ := run(le, "--state-dir", h.Options.Node.StateDir, "--address", addr); code != 0 || !strings.Contains(stdout, "team-a") {
		t.Errorf("flags over the environment: %d\n%s", code, stdout)
	}

	// The driver stopped (no process): `make run`'s layout beside the binary,
	// read from the state file, not from whatever answers at the default address.
	h.Stop()
	lr := locator{procRoot: filepath.Join(dir, "empty"), exe: bin, getenv: noEnv, sameFile: os.SameFile}
	code, stdout, stderr = run(lr)
	if code != 0 || !strings.Contains(stderr, "`make run`'s state beside it: "+filepath.Join(work, "state")) ||
		!strings.Contains(stderr, "from the state file "+filepath.Join(work, "state", framework.StateFile)) || !strings.Contains(stdout, "team-a") {
		t.Errorf("make run's layout: %d %q\n%s", code, stderr, stdout)
	}
	// A binary elsewhere has no layout: the defaults.
	lo := locator{exe: filepath.Join(t.TempDir(), "ephemera-scratch"), getenv: noEnv, sameFile: os.SameFile}
	if code, _, stderr := run(lo, "-v", "--address", ""); code != 1 || !strings.Contains(stderr, "--state-dir="+framework.DefaultStateDir(DriverName)+" (from the default)") {
		t.Errorf("defaults: %d %q", code, stderr)
	}
}

func TestPlaceOf(t *testing.T) {
	p, ok := placeOf([]string{"--v", "2", "--driver-name", "x.example.com", "-logtostderr", "--register", "--metrics-address=0.0.0.0:9809", "--kubelet-root=/k"})
	if !ok || p != (driverPlace{driverName: "x.example.com", stateDir: framework.DefaultStateDir("x.example.com"), kubeletRoot: "/k", address: "127.0.0.1:9809"}) {
		t.Errorf("placeOf: %+v %v", p, ok)
	}
	for in, want := range map[string]string{":9809": "127.0.0.1:9809", "[::]:1": "[::1]:1", "10.0.0.1:2": "10.0.0.1:2", "": "", "localhost:3": "localhost:3"} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}
