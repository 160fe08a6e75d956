package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// "volumes" lists a running driver's volumes through its GET /volumes, and a
// stopped driver's from its state file, read-only; it never changes the file.
func TestVolumesCommand(t *testing.T) {
	fake := mount.NewFake()
	h := startVolumesDriver(t, fake, func(o *framework.Options) { o.Node.Version = "v0.0.1-test" })
	pod := h.Kubelet.NewPod("team-a", "web")
	vol := drivertest.InlineVolume{Name: "scratch"}
	fake.AddDir(filepath.Dir(h.Kubelet.TargetPath(pod, vol.Name)))
	if _, err := h.Node.NodePublishVolume(t.Context(), h.Kubelet.PublishRequest(pod, vol)); err != nil {
		t.Fatal(err)
	}
	addr := h.Driver().MetricsAddr()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := volumesCommand(append([]string{"--state-dir", h.Options.Node.StateDir, "--kubelet-root", h.Options.Node.KubeletRootDir, "--timeout", "300ms"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	decode := func(stdout string) api.VolumeList {
		t.Helper()
		var list api.VolumeList
		if err := json.Unmarshal([]byte(stdout), &list); err != nil {
			t.Fatalf("%v\n%s", err, stdout)
		}
		return list
	}

	// The running driver answers.
	code, stdout, stderr := run("--address", addr, "-o", "json")
	list := decode(stdout)
	if code != 0 || !strings.Contains(stderr, "the running driver at "+addr) || list.Driver != DriverName || list.Version != "v0.0.1-test" ||
		len(list.Volumes) != 1 || list.Volumes[0].Pod.Name != "web" || list.Volumes[0].Pod.UID != pod.UID || !list.Volumes[0].Mounted {
		t.Fatalf("json from the running driver: %d %q %+v", code, stderr, list)
	}
	id := list.Volumes[0].VolumeID
	code, stdout, _ = run("--address", addr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if f := strings.Fields(lines[len(lines)-1]); code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "VOLUME ID ") || len(f) != 7 ||
		strings.Join(f[:6], " ") != strings.Join([]string{id[:16], "team-a", "web", "scratch", "dir", "Published"}, " ") {
		t.Errorf("table from the running driver (short ID %s): %d\n%s", id[:16], code, stdout)
	}
	// -o wide: the whole ID, the pod's UID and the target.
	code, stdout, _ = run("--address", addr, "-o", "wide")
	lines = strings.Split(strings.TrimSpace(stdout), "\n")
	if f := strings.Fields(lines[len(lines)-1]); code != 0 || len(lines) != 2 || len(f) != 9 ||
		strings.Join(f, " ") != strings.Join([]string{id, "team-a", "web", pod.UID, "scratch", "dir", "Published", f[7], h.Kubelet.TargetPath(pod, vol.Name)}, " ") {
		t.Errorf("wide table from the running driver: %d\n%s", code, stdout)
	}
	// Without the address, the running driver's lock keeps the file closed.
	if code, _, stderr := run("--address", ""); code != 1 || !strings.Contains(stderr, "a driver holds") || !strings.Contains(stderr, "--address") {
		t.Errorf("state file of a running driver: %d %q", code, stderr)
	}

	h.Stop()
	path := filepath.Join(h.Options.Node.StateDir, framework.StateFile)
	before := readFile(t, path)
	// Nothing answers at the address any more: the state file is read.
	code, stdout, stderr = run("--address", addr, "-o", "json")
	list = decode(stdout)
	if code != 0 || !strings.Contains(stderr, "the state file "+path) || list.Driver != "" || len(list.Volumes) != 1 ||
		list.Volumes[0].VolumeID != id || list.Volumes[0].Pod.Namespace != "team-a" || list.Volumes[0].Backend != "dir" {
		t.Fatalf("json from the state file: %d %q %+v", code, stderr, list)
	}
	// The Fake's mount is not on the real node.
	if code, stdout, _ := run("--address", addr); code != 0 || !strings.Contains(stdout, "Published (not mounted)") {
		t.Errorf("table from the state file: %d\n%s", code, stdout)
	}
	if after := readFile(t, path); !bytes.Equal(before, after) {
		t.Error("the command changed the state file")
	}

	if code, _, stderr := run("-o", "yaml"); code != 2 || !strings.Contains(stderr, "table, wide or json") {
		t.Errorf("-o yaml: %d %q", code, stderr)
	}
	var errb bytes.Buffer
	if code := volumesCommand([]string{"--state-dir", t.TempDir(), "--address", ""}, &bytes.Buffer{}, &errb); code != 1 || !strings.Contains(errb.String(), "no state file") {
		t.Errorf("no driver and no file: %d %q", code, errb.String())
	}
}

// startVolumesDriver starts the driver with a dir backend on fake, its HTTP
// endpoint on loopback, and what mutate sets.
func startVolumesDriver(t *testing.T, fake *mount.Fake, mutate func(*framework.Options)) *drivertest.Harness {
	t.Helper()
	b, err := dir.New(dir.Options{Root: filepath.Join(t.TempDir(), "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	opts := framework.Options{
		DriverName:    DriverName,
		Backends:      map[string]framework.Backend{"dir": b},
		Volumes:       framework.VolumeOptions{Mounter: fake},
		Observability: framework.ObservabilityOptions{MetricsAddress: "127.0.0.1:0"},
	}
	mutate(&opts)
	return drivertest.Start(t, opts)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A driver running with --volumes-endpoint=false answers 404: the command
// says so instead of waiting for the state file the driver holds.
func TestVolumesCommandEndpointOff(t *testing.T) {
	h := startVolumesDriver(t, mount.NewFake(), func(o *framework.Options) { o.Observability.VolumesEndpoint = new(false) })
	var out, errb bytes.Buffer
	code := volumesCommand([]string{"--state-dir", h.Options.Node.StateDir, "--address", h.Driver().MetricsAddr(), "--timeout", "300ms"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "404") || !strings.Contains(errb.String(), "--volumes-endpoint=false") {
		t.Errorf("volumes of a driver without the endpoint: %d %q", code, errb.String())
	}
}
