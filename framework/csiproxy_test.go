package framework_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	fakeproxy "github.com/ephemera-csi/ephemera/framework/mount/fakecsiproxy"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// The csi-proxy v1 mode driven through the whole framework: the Windows
// decisions of the link seam, but every change on the host a request to a
// fake csi-proxy (unix socket, the real v1 client stubs), and the dir
// backend's storage below the kubelet root where csi-proxy accepts it.

type proxyHarness struct {
	h       *drivertest.Harness
	srv     *fakeproxy.Server
	volumes string // the dir backend's root
	st      store.Store
}

func startProxyHarness(t *testing.T) *proxyHarness {
	t.Helper()
	probe := t.TempDir()
	if err := os.Symlink(probe, filepath.Join(probe, "link")); err != nil {
		t.Skipf("cannot create symlinks here: %v", err)
	}
	kubelet := filepath.Join(t.TempDir(), "kubelet")
	srv := fakeproxy.Start(t, kubelet)
	m, err := mount.NewCSIProxy(mount.CSIProxyOptions{Dial: srv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	volumes := filepath.Join(kubelet, "plugins", "drv", "volumes")
	b, err := dir.New(dir.Options{Root: volumes, Host: m})
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New()
	h := drivertest.Start(t, framework.Options{
		Backends: map[string]framework.Backend{"dir": b},
		Node:     framework.NodeOptions{KubeletRootDir: kubelet},
		Volumes:  framework.VolumeOptions{DefaultBackend: "dir", Mounter: m, WindowsMode: framework.WindowsCSIProxy},
		State:    framework.StateOptions{Store: st},
	})
	srv.Reset()
	return &proxyHarness{h: h, srv: srv, volumes: volumes, st: st}
}

// changes are the calls that change the host, in order.
func changes(s *fakeproxy.Server) []string {
	var out []string
	for _, c := range s.Calls() {
		if c.Method != fakeproxy.PathExists && c.Method != fakeproxy.IsSymlink {
			out = append(out, c.String())
		}
	}
	return out
}

func TestCSIProxyModePublishStatsUnpublish(t *testing.T) {
	p := startProxyHarness(t)
	h := p.h
	pod := h.Kubelet.NewPod("ns", "p")
	target := h.Kubelet.TargetPath(pod, "v")
	backing := filepath.Join(p.volumes, api.VolumeHandle(pod.UID, "v"))
	// The kubelet's empty target directory.
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := linkPublish(t, h, pod, "v"); err != nil {
		t.Fatalf("publish: %v", err)
	}
	got := changes(p.srv)
	want := []string{"Mkdir " + backing, "Rmdir " + target, "CreateSymlink " + target + " -> " + backing}
	if !slices.Equal(got, want) {
		t.Fatalf("publish changed the host by\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	t.Logf("one publish: %d calls to csi-proxy, %d of them changes", len(p.srv.Calls()), len(got))
	if dest := linkDest(t, target); dest != backing {
		t.Fatalf("target links to %s, want %s", dest, backing)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Republish: nothing changes on the host.
	p.srv.Reset()
	if err := linkPublish(t, h, pod, "v"); err != nil {
		t.Fatalf("republish: %v", err)
	}
	if got := changes(p.srv); len(got) != 0 {
		t.Errorf("republish changed the host: %v", got)
	}

	// Stats: the target is asked about through csi-proxy, the usage read in
	// the driver's container.
	p.srv.Reset()
	st, err := h.Node.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{
		VolumeId: api.VolumeHandle(pod.UID, "v"), VolumePath: target})
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	var used int64 = -1
	for _, u := range st.GetUsage() {
		if u.GetUnit() == csi.VolumeUsage_BYTES {
			used = u.GetUsed()
		}
	}
	if used < 5 {
		t.Errorf("stats report %d bytes used, want at least the 5 written: %v", used, st)
	}
	if got := changes(p.srv); len(got) != 0 {
		t.Errorf("stats changed the host: %v", got)
	}
	if !slices.ContainsFunc(p.srv.Calls(), func(c fakeproxy.Call) bool { return c.Method == fakeproxy.IsSymlink && c.Path == target }) {
		t.Errorf("stats did not ask csi-proxy about the target: %v", p.srv.Calls())
	}

	// Unpublish: the link, then the backing directory with everything in it.
	p.srv.Reset()
	if err := linkUnpublish(t, h, pod, "v"); err != nil {
		t.Fatalf("unpublish: %v", err)
	}
	got = changes(p.srv)
	want = []string{"Rmdir " + target, "Rmdir " + backing + " force"}
	if !slices.Equal(got, want) {
		t.Errorf("unpublish changed the host by\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, path := range []string{target, backing} {
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after unpublish: %v", path, err)
		}
	}
}

func TestCSIProxyModeDown(t *testing.T) {
	p := startProxyHarness(t)
	pod := p.h.Kubelet.NewPod("ns", "p")
	p.srv.Stop()
	err := linkPublish(t, p.h, pod, "v")
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("publish with csi-proxy down: %v, want Unavailable (the kubelet retries)", err)
	}
	if !strings.Contains(status.Convert(err).Message(), mount.FilesystemPipe) {
		t.Errorf("message %q does not name the pipe %s", status.Convert(err).Message(), mount.FilesystemPipe)
	}
}

func TestCSIProxyModeRollback(t *testing.T) {
	p := startProxyHarness(t)
	h := p.h
	pod := h.Kubelet.NewPod("ns", "p")
	target := h.Kubelet.TargetPath(pod, "v")
	backing := filepath.Join(p.volumes, api.VolumeHandle(pod.UID, "v"))
	// csi-proxy creates the backing directory, then fails the link.
	p.srv.Fail(func(c fakeproxy.Call) error {
		if c.Method == fakeproxy.CreateSymlink {
			return errors.New("A required privilege is not held by the client.")
		}
		return nil
	})
	err := linkPublish(t, h, pod, "v")
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "A required privilege is not held") {
		t.Fatalf("publish with CreateSymlink failing: %v, want Internal with csi-proxy's message", err)
	}
	got := changes(p.srv)
	want := []string{"Mkdir " + backing, "CreateSymlink " + target + " -> " + backing, "Rmdir " + backing + " force"}
	if !slices.Equal(got, want) {
		t.Errorf("failed publish changed the host by\n  %s\nwant (the backing directory removed again)\n  %s",
			strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if _, err := os.Lstat(backing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("backing directory after the rollback: %v", err)
	}
	recs, err := p.st.List(t.Context())
	if err != nil || len(recs) != 0 {
		t.Errorf("records after the rollback: %v, %v; want none", recs, err)
	}
	// The kubelet's retry, with csi-proxy well again, publishes.
	p.srv.Fail(nil)
	if err := linkPublish(t, h, pod, "v"); err != nil {
		t.Fatalf("publish after the failure: %v", err)
	}
	if dest := linkDest(t, target); dest != backing {
		t.Errorf("target links to %s, want %s", dest, backing)
	}
}
