package plugin_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/backendtest"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounts: run as root")
	}
}

// sockDir is a short directory for sockets (107-byte limit).
func sockDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "eph-plug")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// serveInProcess serves opts until the test ends, on a new socket unless
// opts.Endpoint names one.
func serveInProcess(t *testing.T, opts pluginserver.Options) string {
	t.Helper()
	if opts.Endpoint == "" {
		opts.Endpoint = "unix://" + filepath.Join(sockDir(t), "p.sock")
	}
	if opts.Name == "" {
		opts.Name = "in-process"
	}
	s, err := pluginserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin server: %v", err)
		}
	})
	waitServing(t, opts.Endpoint)
	return opts.Endpoint
}

func waitServing(t *testing.T, endpoint string) {
	t.Helper()
	p := strings.TrimPrefix(endpoint, "unix://")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if c, err := net.Dial("unix", p); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("nothing serves %s", endpoint)
}

func newClient(t *testing.T, opts plugin.Options) *plugin.Backend {
	t.Helper()
	if opts.Name == "" {
		opts.Name = "backendtest"
	}
	b, err := plugin.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// The backend conformance suite, unchanged, against the tmpfs backend served
// as a plugin over its socket.
func TestConformanceTmpfs(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		mem, err := tmpfs.New(tmpfs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ep := serveInProcess(t, pluginserver.Options{Backend: mem})
		return newClient(t, plugin.Options{Endpoint: ep})
	}, backendtest.Options{
		Params: map[string]string{"size": "16Mi", "mode": "0750"},
		Size:   16 << 20,
		Mount:  true,
	})
}

// The same against the dir backend: directories cross the protocol relative
// to the shared directory and are mounted beneath it.
func TestConformanceDir(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		shared := t.TempDir()
		b, err := dir.New(dir.Options{Root: shared})
		if err != nil {
			t.Fatal(err)
		}
		ep := serveInProcess(t, pluginserver.Options{Backend: b, Dir: shared})
		return newClient(t, plugin.Options{Endpoint: ep, Dir: shared})
	}, backendtest.Options{Mount: true})
}

// A content-only plugin: no Create, so the volume is the driver's tmpfs.
func TestConformanceContentOnly(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		ep := serveInProcess(t, pluginserver.Options{Content: framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{"id": {Data: []byte(v.ID)}}, nil
		})})
		return newClient(t, plugin.Options{Endpoint: ep})
	}, backendtest.Options{
		Params: map[string]string{"size": "8Mi"},
		Size:   8 << 20,
		Mount:  true,
	})
}

// startDriver runs an in-process driver with one backend, "p".
func startDriver(t *testing.T, b framework.Backend, opts framework.Options) *drivertest.Harness {
	t.Helper()
	opts.Backends = map[string]framework.Backend{"p": b}
	return drivertest.Start(t, opts)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var size = map[string]string{"size": "4Mi"}

// A plugin running as its own process provides the content of a tmpfs the
// driver mounts; the volume is unpublished and nothing is left.
func TestPublishThroughPluginProcess(t *testing.T) {
	requireRoot(t)
	p := startPlugin(t, "content", versionEnv+"=1")
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint}), framework.Options{})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("shop", "cart")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size, ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "v")
	if got := readFile(t, filepath.Join(target, "pod")); got != "shop/cart" {
		t.Errorf("pod file = %q", got)
	}
	if !isTmpfs(t, target) {
		t.Error("the target is not a tmpfs")
	}
	// The tmpfs attributes apply to a content-only plugin's volumes; an
	// unknown one is refused with the accepted keys.
	typo := k.NewPod("shop", "typo")
	err := k.Publish(ctx, typo, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "4Mi", "moed": "0700"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "mode") {
		t.Errorf("publish with an unknown attribute: %v, want InvalidArgument naming mode", err)
	}
	for _, pd := range []*drivertest.Pod{pod, typo} {
		if err := k.DeletePod(ctx, pd); err != nil {
			t.Fatal(err)
		}
	}
	h.RequireClean(t)
}

// Plugin not running: the publish gets Unavailable (the kubelet retries) and
// nothing is left; once the plugin runs, the retry succeeds.
func TestPluginNotRunning(t *testing.T) {
	requireRoot(t)
	ep := "unix://" + filepath.Join(sockDir(t), "absent.sock")
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: ep}), framework.Options{})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "early")
	err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "plugin p") {
		t.Fatalf("publish without the plugin: %v, want Unavailable naming plugin p", err)
	}
	requireNoVolume(t, h, k.TargetPath(pod, "v"))
	drivertest.StartPlugin(t, drivertest.PluginOptions{Command: os.Args[0], Endpoint: ep, Env: []string{modeEnv + "=content", versionEnv + "=1"}})
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size}); err != nil {
		t.Fatalf("retry once the plugin runs: %v", err)
	}
	if got := readFile(t, filepath.Join(k.TargetPath(pod, "v"), "version")); got != "1" {
		t.Errorf("version = %q", got)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}

// The plugin dies (SIGKILL) in the middle of a first publish's Create: the
// publish fails with Unavailable and is rolled back; nothing is mounted.
func TestPluginDiesMidCreate(t *testing.T) {
	requireRoot(t)
	shared := t.TempDir()
	p := startPlugin(t, "dir", dirEnv+"="+shared, hangEnv+"=Create")
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint, Dir: shared}), framework.Options{})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "crash")
	errc := make(chan error, 1)
	go func() { errc <- k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v"}) }()
	waitHanging(t, p)
	p.Kill()
	if err := <-errc; status.Code(err) != codes.Unavailable {
		t.Fatalf("publish while the plugin died: %v, want Unavailable", err)
	}
	// Its record stays (not published) until the plugin can delete
	// whatever it may have created.
	if mounted, _ := isMountPoint(k.TargetPath(pod, "v")); mounted {
		t.Error("the target is mounted after a failed publish")
	}
	// The kubelet gives up on the pod: nothing of the volume is left once
	// the plugin is back (a record kept for a Delete the plugin could not
	// take is cleaned up by it).
	p.Start()
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
	if entries, _ := os.ReadDir(filepath.Join(shared, "volumes")); len(entries) != 0 {
		t.Errorf("the plugin's directory still holds %d volumes", len(entries))
	}
}

// The plugin dies during a refresh (a republish): the kubelet gets a
// retryable error (issue 44: a failed refresh is never answered OK) and the
// live volume keeps its last good content; a restarted plugin (another
// version, handshake again) refreshes it.
func TestPluginDiesDuringRefresh(t *testing.T) {
	requireRoot(t)
	p := startPlugin(t, "content", versionEnv+"=1")
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint}), framework.Options{})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "live")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(k.TargetPath(pod, "v"), "version")
	p.Kill()
	if err := k.Republish(ctx, pod, "v"); err == nil || drivertest.IsFinal(err) {
		t.Fatalf("republish with the plugin dead: %v, want a retryable error (the volume keeps its content)", err)
	}
	if got := readFile(t, file); got != "1" {
		t.Fatalf("content after a failed refresh = %q, want the last good %q", got, "1")
	}
	p.Stop()
	p2 := drivertest.StartPlugin(t, drivertest.PluginOptions{Command: os.Args[0], Endpoint: p.Endpoint, Env: []string{modeEnv + "=content", versionEnv + "=2"}})
	_ = p2
	if err := k.Republish(ctx, pod, "v"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, file); got != "2" {
		t.Errorf("content after the plugin came back as version 2 = %q", got)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}

// A plugin that does not answer within the framework's deadline: the first
// publish fails and is rolled back.
func TestPluginSlow(t *testing.T) {
	requireRoot(t)
	p := startPlugin(t, "content", hangEnv+"=Content")
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint}), framework.Options{Volumes: framework.VolumeOptions{ContentTimeout: 300 * time.Millisecond}})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "slow")
	start := time.Now()
	err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "did not answer in time") {
		t.Fatalf("publish with a hanging plugin: %v, want Unavailable (deadline)", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the publish took %s; the content deadline is 300ms", d)
	}
	requireNoVolume(t, h, k.TargetPath(pod, "v"))
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}

// A plugin restarted as another version with other capabilities is
// handshaken again: its new Authorize applies to the next first publish.
func TestPluginRestartNewVersion(t *testing.T) {
	requireRoot(t)
	p := startPlugin(t, "content", versionEnv+"=1")
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint}), framework.Options{})
	k, ctx := h.Kubelet, t.Context()
	a := k.NewPod("team-a", "one")
	if err := k.Publish(ctx, a, drivertest.InlineVolume{Name: "v", Attributes: size}); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	drivertest.StartPlugin(t, drivertest.PluginOptions{Command: os.Args[0], Endpoint: p.Endpoint,
		Env: []string{modeEnv + "=content", versionEnv + "=2", denyEnv + "=team-b"}})
	b := k.NewPod("team-b", "two")
	err := k.Publish(ctx, b, drivertest.InlineVolume{Name: "v", Attributes: size})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "namespace team-b may not use test-plugin") {
		t.Fatalf("publish after the plugin gained AUTHORIZE: %v, want PermissionDenied with its reason", err)
	}
	c := k.NewPod("team-a", "three")
	if err := k.Publish(ctx, c, drivertest.InlineVolume{Name: "v", Attributes: size}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(k.TargetPath(c, "v"), "version")); got != "2" {
		t.Errorf("version = %q, want 2", got)
	}
	for _, pd := range []*drivertest.Pod{a, b, c} {
		if err := k.DeletePod(ctx, pd); err != nil {
			t.Fatal(err)
		}
	}
	h.RequireClean(t)
}

// The startup reconcile works through the plugin's List: with the state file
// lost, the plugin's storage of a live pod is adopted, never deleted, and the
// pod's unpublish deletes it through the plugin.
func TestPluginLostStateAdopted(t *testing.T) {
	requireRoot(t)
	shared := t.TempDir()
	p := startPlugin(t, "dir", dirEnv+"="+shared)
	h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint, Dir: shared}), framework.Options{})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "keep")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(k.TargetPath(pod, "v"), "data")
	if err := os.WriteFile(data, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.Stop()
	if err := os.RemoveAll(h.Options.Node.StateDir); err != nil {
		t.Fatal(err)
	}
	h.RestartDriver()
	if got := readFile(t, data); got != "precious" {
		t.Fatalf("data after a lost state file = %q", got)
	}
	if err := k.Republish(ctx, pod, "v"); err != nil {
		t.Fatal(err)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
	if entries, _ := os.ReadDir(filepath.Join(shared, "volumes")); len(entries) != 0 {
		t.Errorf("the plugin's directory still holds %d volumes after the pod's deletion", len(entries))
	}
}

// grpcServer serves a hand-written plugin service (one that breaks the
// protocol) on a new socket.
func grpcServer(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	p := filepath.Join(sockDir(t), "bad.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return "unix://" + p
}

// requireNoVolume checks that a failed first publish left no mount at target
// and no record.
func requireNoVolume(t *testing.T, h *drivertest.Harness, target string) {
	t.Helper()
	if mounted, _ := isMountPoint(target); mounted {
		t.Errorf("%s is mounted after a failed publish", target)
	}
	resp, err := h.Driver().Records(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp) != 0 {
		t.Errorf("records after a failed publish: %v", resp)
	}
}
