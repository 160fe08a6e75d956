//go:build linux

package framework_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for real mounts (CI runs as root)")
	}
}

// realHarness starts a driver with real mounts and bbolt state. Every mount
// under the test's kubelet root is unmounted at cleanup, even on failure.
func realHarness(t *testing.T, mutate func(*framework.Options)) *drivertest.Harness {
	t.Helper()
	requireRoot(t)
	base := t.TempDir()
	d, err := dir.New(dir.Options{Root: filepath.Join(base, "state", "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	opts := framework.Options{
		Backends: map[string]framework.Backend{
			"tmpfs": newTmpfs(t, tmpfs.Options{}),
			"dir":   d,
		},
		Node: framework.NodeOptions{
			KubeletRootDir: filepath.Join(base, "kubelet"),
			StateDir:       filepath.Join(base, "state"),
		},
		Volumes: framework.VolumeOptions{DefaultBackend: "tmpfs"},
	}
	if mutate != nil {
		mutate(&opts)
	}
	t.Cleanup(func() { unmountAll(t, base) })
	return drivertest.Start(t, opts)
}

// unmountAll removes leftovers deepest-first so a failed test leaks nothing.
func unmountAll(t *testing.T, dir string) {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Error(err)
		return
	}
	under := mount.MountsUnder(infos, dir)
	for i := len(under) - 1; i >= 0; i-- {
		t.Logf("cleanup: unmounting leftover %s", under[i].MountPoint)
		if err := syscall.Unmount(under[i].MountPoint, syscall.MNT_DETACH); err != nil {
			t.Errorf("cleanup unmount %s: %v", under[i].MountPoint, err)
		}
	}
}

func mountsAt(t *testing.T, path string) int {
	t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	return mount.MountsAt(infos, path)
}

func fsTypeAt(t *testing.T, path string) string {
	t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	for _, mi := range infos {
		if mi.MountPoint == path {
			return mi.FSType
		}
	}
	return ""
}

func records(t *testing.T, h *drivertest.Harness) []*store.Record {
	t.Helper()
	// The driver holds the bbolt lock; stop it to read the file, then restart.
	h.Stop()
	defer h.RestartDriver()
	st, err := boltstore.Open(filepath.Join(h.Options.Node.StateDir, framework.StateFile), boltstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestTmpfsLifecycle(t *testing.T) {
	h := realHarness(t, nil)
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("default", "web")
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"size": "1Mi"}}
	target := k.TargetPath(pod, "scratch")

	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%d mounts at target, want 1", n)
	}
	if fs := fsTypeAt(t, target); fs != "tmpfs" {
		t.Errorf("fstype %q, want tmpfs", fs)
	}
	if err := os.WriteFile(filepath.Join(target, "small"), []byte("hello"), 0o644); err != nil {
		t.Fatalf("write into volume: %v", err)
	}
	err := os.WriteFile(filepath.Join(target, "big"), make([]byte, 2<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing 2MiB into a 1Mi volume: err = %v, want ENOSPC", err)
	}

	// Duplicate publish and a kubelet-restart republish: OK, still one mount,
	// data intact.
	if err := k.Republish(ctx, pod, "scratch"); err != nil {
		t.Fatalf("republish: %v", err)
	}
	if err := k.Restart(ctx); err != nil {
		t.Fatalf("kubelet restart: %v", err)
	}
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%d mounts after republish, want exactly 1", n)
	}
	if b, err := os.ReadFile(filepath.Join(target, "small")); err != nil || string(b) != "hello" {
		t.Fatalf("data after republish: %q, %v", b, err)
	}

	// The same volume with other attributes is AlreadyExists and leaves it alone.
	req := k.PublishRequest(pod, drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"size": "2Mi"}})
	if _, err := h.Node.NodePublishVolume(ctx, req); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("changed attributes: %v, want AlreadyExists", err)
	}
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%d mounts after refused publish", n)
	}

	if recs := records(t, h); len(recs) != 1 || recs[0].Phase != store.PhasePublished || recs[0].Size != 1<<20 {
		t.Fatalf("records = %+v, want one Published 1MiB record", recs)
	}

	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	if n := mountsAt(t, target); n != 0 {
		t.Fatalf("%d mounts after unpublish", n)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("target still exists: %v", err)
	}
	if recs := records(t, h); len(recs) != 0 {
		t.Fatalf("records left after unpublish: %+v", recs)
	}
	// Unpublish again: OK.
	if _, err := h.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, "scratch"), TargetPath: target}); err != nil {
		t.Fatalf("second unpublish: %v", err)
	}
}

func TestDirBackendBindAndReadOnly(t *testing.T) {
	h := realHarness(t, nil)
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("default", "db")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "data", Attributes: map[string]string{"backend": "dir", "mode": "0750"}}); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "data")
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	backing := filepath.Join(h.Options.Node.StateDir, "volumes", api.VolumeHandle(pod.UID, "data"))
	if _, err := os.Stat(filepath.Join(backing, "f")); err != nil {
		t.Fatalf("file not in backing dir: %v", err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o750 {
		t.Errorf("mode %v, want 0750", fi.Mode().Perm())
	}

	ro := drivertest.InlineVolume{Name: "ro", ReadOnly: true, Attributes: map[string]string{"size": "1Mi"}}
	rodir := drivertest.InlineVolume{Name: "rodir", ReadOnly: true, Attributes: map[string]string{"backend": "dir"}}
	for _, v := range []drivertest.InlineVolume{ro, rodir} {
		if err := k.Publish(ctx, pod, v); err != nil {
			t.Fatalf("publish %s: %v", v.Name, err)
		}
		err := os.WriteFile(filepath.Join(k.TargetPath(pod, v.Name), "f"), []byte("x"), 0o600)
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("write to read-only %s: %v, want EROFS", v.Name, err)
		}
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(backing); !os.IsNotExist(err) {
		t.Fatalf("backing dir left: %v", err)
	}
	if n := len(mountUnder(t, h.Options.Node.KubeletRootDir)); n != 0 {
		t.Fatalf("%d mounts left", n)
	}
}

func mountUnder(t *testing.T, dir string) []mount.MountInfo {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	return mount.MountsUnder(infos, dir)
}

func TestDriverRestartKeepsVolumesAndRepairs(t *testing.T) {
	h := realHarness(t, nil)
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("default", "a")
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "dir"}}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "v")
	os.WriteFile(filepath.Join(target, "keep"), []byte("1"), 0o644)

	h.RestartDriver()
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%d mounts after driver restart", n)
	}
	// Someone unmounted the volume (or the node rebooted): a republish repairs it
	// and the dir backend's data is still there.
	if err := syscall.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if err := k.Republish(ctx, pod, "v"); err != nil {
		t.Fatalf("republish: %v", err)
	}
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%d mounts after repair, want 1", n)
	}
	if _, err := os.Stat(filepath.Join(target, "keep")); err != nil {
		t.Fatalf("data lost in repair: %v", err)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentPublishes: 40 pods at once, more than a backend's share of
// the in-flight lanes (32): every volume is published and torn down, the
// calls past the share retried as the kubelet would (its backoff, fifty
// times faster).
func TestConcurrentPublishes(t *testing.T) {
	h := realHarness(t, nil)
	k := h.Kubelet
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	retry := drivertest.KubeletBackoff(1.0 / 50)
	const n = 40
	pods := make([]*drivertest.Pod, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range pods {
		pods[i] = k.NewPod("ns", "p")
		wg.Add(1)
		go func(p *drivertest.Pod) {
			defer wg.Done()
			_, err := retry.Retry(ctx, func(ctx context.Context) error {
				return k.Publish(ctx, p, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}})
			})
			errs <- err
		}(pods[i])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	if got := len(mountUnder(t, h.Options.Node.KubeletRootDir)); got != n {
		t.Fatalf("%d mounts, want %d", got, n)
	}
	for _, p := range pods {
		wg.Add(1)
		go func(p *drivertest.Pod) {
			defer wg.Done()
			if _, err := retry.Retry(ctx, func(ctx context.Context) error { return k.DeletePod(ctx, p) }); err != nil {
				t.Errorf("delete: %v", err)
			}
		}(p)
	}
	wg.Wait()
	if got := len(mountUnder(t, h.Options.Node.KubeletRootDir)); got != 0 {
		t.Fatalf("%d mounts left", got)
	}
	if recs := records(t, h); len(recs) != 0 {
		t.Fatalf("%d records left", len(recs))
	}
}

func TestContentAndSecretsNeverLogged(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	h := realHarness(t, func(o *framework.Options) {
		o.Observability.Logger = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(lockedWriter{&mu, &logs}), textlogger.Verbosity(10)))
		o.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{
				"pod":         {Data: []byte(v.Pod.Namespace + "/" + v.Pod.Name)},
				"sub/secret":  {Data: []byte(v.Secrets["password"]), Mode: 0o400},
				"sub/backend": {Data: []byte(v.Backend)},
			}, nil
		})
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("shop", "cart")
	const secret, token = "s3cr3t-VALUE", "eyJhbGciOi-TOKEN"
	vol := drivertest.InlineVolume{
		Name:       "creds",
		ReadOnly:   true,
		Attributes: map[string]string{"size": "1Mi"},
		Secrets:    map[string]string{"password": secret},
		Tokens:     `{"vault":{"token":"` + token + `","expirationTimestamp":"2030-01-01T00:00:00Z"}}`,
	}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	// Kubernetes >= 1.35 with serviceAccountTokenInSecrets: the tokens arrive in
	// secrets; they must stay out of the logs and out of v.Secrets.
	vol2 := vol
	vol2.Name, vol2.TokensInSecrets = "creds2", true
	vol2.Tokens = `{"vault":{"token":"` + token + `-2","expirationTimestamp":"2030-01-01T00:00:00Z"}}`
	if err := k.Publish(ctx, pod, vol2); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(k.TargetPath(pod, "creds2"), "sub", "secret")); string(b) != secret {
		t.Errorf("secret file with tokens in secrets = %q", b)
	}
	target := k.TargetPath(pod, "creds")
	if b, _ := os.ReadFile(filepath.Join(target, "pod")); string(b) != "shop/cart" {
		t.Errorf("pod file = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(target, "sub", "secret")); string(b) != secret {
		t.Errorf("secret file = %q", b)
	}
	if fi, err := os.Stat(filepath.Join(target, "sub", "secret")); err != nil || fi.Mode().Perm() != 0o400 {
		t.Errorf("secret file mode: %v %v", fi, err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("read-only content volume writable: %v", err)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "NodePublishVolume") || !strings.Contains(out, "***stripped***") {
		t.Fatalf("request not logged sanitized at V(4); logs:\n%s", out)
	}
	for _, leak := range []string{secret, token} {
		if strings.Contains(out, leak) {
			t.Errorf("log contains %q", leak)
		}
	}
	if recs := records(t, h); len(recs) != 0 {
		t.Errorf("records left: %d", len(recs))
	}
	// The state file never holds secrets either (checked while a volume exists).
	pod = k.NewPod("shop", "cart2")
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	h.Stop()
	raw, err := os.ReadFile(filepath.Join(h.Options.Node.StateDir, framework.StateFile))
	h.RestartDriver()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(secret)) || bytes.Contains(raw, []byte(token)) {
		t.Error("state.db contains a secret or token")
	}
	if !bytes.Contains(raw, []byte(api.VolumeHandle(pod.UID, "creds"))) {
		t.Error("state.db does not contain the volume record (test would be vacuous)")
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
