//go:build linux

package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// pluginEnv makes the test binary run "tokenfile plugin" with the flags in
// it (space-separated) instead of the tests: the plugin as a process of its
// own, as in production, without a go build.
const pluginEnv = "TOKENFILE_TEST_PLUGIN_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(pluginEnv); ok {
		if err := pluginMain(strings.Fields(args)); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// pluginProc is the plugin running as its own process.
type pluginProc struct {
	t        *testing.T
	endpoint string
	cmd      *exec.Cmd
	log      drivertest.SyncBuffer
}

// startPlugin starts "tokenfile plugin" on endpoint, allowing team-a and
// team-b, and waits for its socket.
func (p *pluginProc) start() {
	p.t.Helper()
	p.cmd = exec.Command(os.Args[0])
	p.cmd.Env = append(os.Environ(), pluginEnv+"=--endpoint="+p.endpoint+" --allowed-namespaces=team-a,team-b --v=4")
	p.cmd.Stderr = &p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	sock := strings.TrimPrefix(p.endpoint, "unix://")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// A dead plugin's socket file stays: wait for this process to accept.
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("plugin did not create %s:\n%s", sock, p.log.String())
		}
	}
}

// kill stops the plugin with SIGKILL: its socket stays behind, as after a crash.
func (p *pluginProc) kill() {
	if p.cmd != nil && p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// stop stops the plugin gracefully.
func (p *pluginProc) stop() {
	if p.cmd != nil && p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_ = p.cmd.Wait()
	}
}

// TestPlugin runs tokenfile in plugin mode as a process of its own, behind a
// scratch-like driver (tmpfs, plus the plugin as backend "tokens" through
// framework/plugin, as ephemera-scratch --plugin makes it): the driver mounts
// a tmpfs, the plugin's token file appears in it and follows republishes;
// the plugin's refusals reach the kubelet; a dead plugin makes publishes
// fail with Unavailable naming it until it runs again.
func TestPlugin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts tmpfs: run as root")
	}
	sockDir, err := os.MkdirTemp("", "tokenfile-plugin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	p := &pluginProc{t: t, endpoint: "unix://" + filepath.Join(sockDir, "tokens.sock")}
	p.start()
	t.Cleanup(p.kill)

	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var dlog drivertest.SyncBuffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&dlog), textlogger.Verbosity(10)))
	tokensBackend, err := plugin.New(plugin.Options{Name: "tokens", Endpoint: p.endpoint, Tmpfs: mem,
		DriverName: "scratch.csi.ephemera.dev", NodeID: "node-1", Timeout: 5 * time.Second, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tokensBackend.Close() })
	h := drivertest.Start(t, framework.Options{
		DriverName:    "scratch.csi.ephemera.dev",
		Backends:      map[string]framework.Backend{"tmpfs": mem, "tokens": tokensBackend},
		Volumes:       framework.VolumeOptions{DefaultBackend: "tmpfs"},
		Observability: framework.ObservabilityOptions{Logger: logger},
	})
	k, ctx := h.Kubelet, t.Context()

	pod := k.NewPod("team-a", "app")
	vol := drivertest.InlineVolume{Name: "vault", ReadOnly: true,
		Attributes: map[string]string{"backend": "tokens", "audience": "vault"}, Tokens: tokens("vault", "tok-1")}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatalf("publish: %v\ndriver log:\n%s\nplugin log:\n%s", err, dlog.String(), p.log.String())
	}
	target := k.TargetPath(pod, "vault")
	t.Cleanup(func() { syscall.Unmount(target, syscall.MNT_DETACH) }) // only if the test failed midway
	expect(t, filepath.Join(target, "token"), "tok-1")
	ms := mountsUnder(t, target)
	if len(ms) != 1 || ms[0].FSType != "tmpfs" || !strings.Contains(ms[0].SuperOptions, "size=1024k") {
		t.Errorf("mounts at the target %+v, want one tmpfs of the plugin's default size 1Mi", ms)
	}
	vol.Tokens = tokens("vault", "tok-2")
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatalf("republish: %v", err)
	}
	expect(t, filepath.Join(target, "token"), "tok-2")

	// The plugin's refusals, as the pod's events would carry them.
	pods := []*drivertest.Pod{pod}
	for _, tc := range []struct {
		ns    string
		attrs map[string]string
		code  codes.Code
		msg   string
	}{
		{"team-c", map[string]string{"backend": "tokens", "audience": "vault"}, codes.PermissionDenied, "--allowed-namespaces"},
		{"team-a", map[string]string{"backend": "tokens"}, codes.InvalidArgument, `"audience" is required`},
		{"team-a", map[string]string{"backend": "tokens", "audience": "vault", "audiance": "x"}, codes.InvalidArgument, `"audiance"`},
		{"team-a", map[string]string{"backend": "tokens", "audience": "vault", "nr_inodes": "10"}, codes.InvalidArgument, "not available in plugin mode"},
		{"team-a", map[string]string{"backend": "tokens", "audience": "other"}, codes.InvalidArgument, `must list audience "other" in spec.tokenRequests`},
	} {
		bad := k.NewPod(tc.ns, "bad")
		pods = append(pods, bad)
		err := k.Publish(ctx, bad, drivertest.InlineVolume{Name: "v", Attributes: tc.attrs, Tokens: tokens("vault", "x")})
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "tokens") {
			t.Errorf("%s %v: %v, want %v mentioning %s and the plugin", tc.ns, tc.attrs, err, tc.code, tc.msg)
		}
	}

	// The plugin dies: a new volume cannot be published, with a message that
	// names the plugin and its socket; the live volume stays.
	p.kill()
	pod2 := k.NewPod("team-b", "app2")
	pods = append(pods, pod2)
	vol2 := drivertest.InlineVolume{Name: "vault", Attributes: map[string]string{"backend": "tokens", "audience": "vault"}, Tokens: tokens("vault", "tok-3")}
	err = k.Publish(ctx, pod2, vol2)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "plugin tokens") || !strings.Contains(err.Error(), p.endpoint[len("unix://"):]) {
		t.Fatalf("publish with the plugin down: %v, want Unavailable naming plugin tokens and its socket", err)
	}
	expect(t, filepath.Join(target, "token"), "tok-2")
	// It runs again (a new process on the same socket): the kubelet's retry succeeds.
	// Calls fail fast until the client's reconnect backoff (about 1 s after
	// a short outage) dials again; the kubelet retries as this loop does.
	p.start()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := k.Publish(ctx, pod2, vol2)
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("publish after the plugin restarted: %v", err)
		}
	}
	expect(t, filepath.Join(k.TargetPath(pod2, "vault"), "token"), "tok-3")

	for _, pd := range pods {
		if err := k.DeletePod(ctx, pd); err != nil {
			t.Fatalf("delete pod: %v", err)
		}
	}
	h.RequireClean(t)
	h.Stop()
	p.stop()
	if _, err := os.Stat(strings.TrimPrefix(p.endpoint, "unix://")); !os.IsNotExist(err) {
		t.Errorf("the plugin left its socket behind: %v", err)
	}
	for _, tok := range []string{"tok-1", "tok-2", "tok-3"} {
		if strings.Contains(dlog.String(), tok) || strings.Contains(p.log.String(), tok) {
			t.Errorf("token %s was logged", tok)
		}
	}
	if !strings.Contains(p.log.String(), "Content") {
		t.Errorf("the plugin logged no Content call at --v=4:\n%s", p.log.String())
	}
}
