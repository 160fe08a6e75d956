package greeter_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// requireEnv is set by make test-examples, which runs npm ci first: there, a
// missing node or node_modules fails the test instead of skipping it.
const requireEnv = "EPHEMERA_REQUIRE_NODE"

const driverName = "scratch.csi.ephemera.dev"

// TestGreeterPlugin runs index.js as its own process, an in-process driver
// with it as backend "greeter" (plugin.New), and publishes pods' volumes the
// way the kubelet does: the files, the plugin's refusals, a killed plugin and
// its restart, and the cleanup.
func TestGreeterPlugin(t *testing.T) {
	node := requireNode(t)
	if os.Geteuid() != 0 {
		t.Skip("the driver mounts tmpfs volumes: run as root")
	}
	// Unix socket paths are limited to 107 bytes: t.TempDir() may be too long.
	dir, err := os.MkdirTemp("", "greeter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "greeter.sock")

	proc := startPlugin(t, node, sock, "1")
	first := proc
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
	}

	checkProtocol(t, sock)

	backend, err := plugin.New(plugin.Options{
		Name: "greeter", Endpoint: "unix://" + sock, DriverName: driverName, NodeID: "node-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	h := drivertest.Start(t, framework.Options{
		DriverName: driverName,
		Node:       framework.NodeOptions{ID: "node-1"},
		Backends:   map[string]framework.Backend{"greeter": backend},
	})
	k := h.Kubelet
	ctx := t.Context()
	var pods []*drivertest.Pod
	newPod := func(namespace, name string) *drivertest.Pod {
		p := k.NewPod(namespace, name)
		pods = append(pods, p)
		return p
	}
	vol := func(attrs map[string]string) drivertest.InlineVolume {
		return drivertest.InlineVolume{Name: "hello", ReadOnly: true, Attributes: attrs}
	}

	// A volume with a greeting: a read-only tmpfs with the plugin's files. The
	// secret and the token reach the plugin (Content) and must stay out of its log.
	const secret, token = "s3cret-value-never-logged", "token-value-never-logged"
	cart := newPod("shop", "cart-7d9f")
	cartVol := vol(map[string]string{"greeting": "Howdy"})
	cartVol.Secrets = map[string]string{"password": secret}
	cartVol.Tokens = `{"greeter":{"token":"` + token + `","expirationTimestamp":"2030-01-01T00:00:00Z"}}`
	if err := k.Publish(ctx, cart, cartVol); err != nil {
		t.Fatalf("publish: %v", err)
	}
	target := k.TargetPath(cart, "hello")
	t.Cleanup(func() { syscall.Unmount(target, syscall.MNT_DETACH) }) // only if the test failed midway
	checkVolume(t, target, cart, "Howdy, cart-7d9f!\n")
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err == nil {
		t.Error("readOnly volume is writable")
	}

	// Without attributes: the default greeting, and the plugin's default size (1Mi).
	web := newPod("shop", "web-1")
	if err := k.Publish(ctx, web, vol(nil)); err != nil {
		t.Fatalf("publish without attributes: %v", err)
	}
	webTarget := k.TargetPath(web, "hello")
	t.Cleanup(func() { syscall.Unmount(webTarget, syscall.MNT_DETACH) })
	checkVolume(t, webTarget, web, "Hello, web-1!\n")
	var st syscall.Statfs_t
	if err := syscall.Statfs(webTarget, &st); err != nil {
		t.Fatal(err)
	} else if size := int64(st.Blocks) * st.Bsize; size != 1<<20 {
		t.Errorf("tmpfs size %d, want the plugin's default 1Mi", size)
	}

	// Refusals: each a final error, nothing published.
	for _, tc := range []struct {
		name      string
		pod       *drivertest.Pod
		attrs     map[string]string
		code      codes.Code
		wantInMsg []string
	}{
		{"unknown attribute", newPod("shop", "typo"), map[string]string{"greeting": "Hi", "colour": "blue"},
			codes.InvalidArgument, []string{`"colour"`, "accepted: greeting"}},
		{"greeting too long", newPod("shop", "long"), map[string]string{"greeting": strings.Repeat("a", 129)},
			codes.InvalidArgument, []string{"greeting", "at most 128"}},
		{"denied namespace", newPod("blocked", "web"), nil,
			codes.PermissionDenied, []string{"pods in namespace blocked may not use greeter volumes"}},
	} {
		err := k.Publish(ctx, tc.pod, vol(tc.attrs))
		if status.Code(err) != tc.code {
			t.Errorf("%s: publish error %v, want %s", tc.name, err, tc.code)
			continue
		}
		for _, s := range tc.wantInMsg {
			if !strings.Contains(status.Convert(err).Message(), s) {
				t.Errorf("%s: message %q lacks %q", tc.name, status.Convert(err).Message(), s)
			}
		}
		requireNothingAt(t, h, tc.pod)
	}

	// The plugin is killed: a new publish fails with Unavailable (the kubelet
	// retries) and leaves nothing; the published volumes stay.
	if err := proc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = proc.wait()
	late := newPod("shop", "late")
	err = k.Publish(ctx, late, vol(nil))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("publish with the plugin killed: %v, want Unavailable", err)
	}
	t.Logf("with the plugin killed: %v", err)
	requireNothingAt(t, h, late)
	checkVolume(t, target, cart, "Howdy, cart-7d9f!\n")

	// Restarted on the same (stale) socket, the plugin serves again: the
	// kubelet's retry publishes the volume after a new handshake.
	proc = startPlugin(t, node, sock, "2")
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = k.Publish(ctx, late, vol(nil))
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("publish after the plugin restarted: %v", err)
	}
	lateTarget := k.TargetPath(late, "hello")
	t.Cleanup(func() { syscall.Unmount(lateTarget, syscall.MNT_DETACH) })
	checkVolume(t, lateTarget, late, "Hello, late!\n")

	for _, p := range pods {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Errorf("delete pod %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
	h.RequireClean(t)

	// SIGTERM: a graceful stop that removes the socket.
	if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proc.wait(); err != nil {
		t.Errorf("plugin after SIGTERM: %v, want exit status 0", err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket after SIGTERM: %v, want it removed", err)
	}
	for _, p := range []*pluginProc{first, proc} {
		b, err := os.ReadFile(p.log)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), secret) || strings.Contains(string(b), token) {
			t.Errorf("the plugin logged a secret or a token:\n%s", b)
		}
		if !strings.Contains(string(b), `"msg":"Call"`) {
			t.Errorf("the plugin logged no call (--verbose):\n%s", b)
		}
	}
}

// requireNode returns the path of node when it and the plugin's node_modules
// are there, and skips the test otherwise (fails it when requireEnv is set).
func requireNode(t *testing.T) string {
	t.Helper()
	missing := func(msg string) {
		t.Helper()
		if os.Getenv(requireEnv) != "" {
			t.Fatalf("%s (%s is set: make test-examples runs npm ci)", msg, requireEnv)
		}
		t.Skip(msg)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node (Node.js 20 or later) is not in PATH")
	}
	if _, err := os.Stat(filepath.Join("node_modules", "@grpc", "grpc-js", "package.json")); err != nil {
		missing("examples/plugin-node/node_modules is missing: run npm ci --ignore-scripts there")
	}
	return node
}

// pluginProc is the plugin's process.
type pluginProc struct {
	cmd  *exec.Cmd
	log  string        // its stdout and stderr
	done chan struct{} // closed when it exited
	err  error         // Wait's, once done
}

// wait waits for the process to exit and returns Wait's error.
func (p *pluginProc) wait() error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(30 * time.Second):
		return errors.New("still running after 30s")
	}
}

// startPlugin starts index.js on sock (refusing namespace "blocked") and
// waits until it serves. Its log goes to a file that the test prints if it
// fails. The process is killed at the end of the test if it still runs.
func startPlugin(t *testing.T, node, sock, run string) *pluginProc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "plugin-"+run+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(node, "index.js", "--endpoint", "unix://"+sock, "--verbose")
	cmd.Env = append(os.Environ(), "GREETER_DENY_NAMESPACES=kube-system, blocked")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pluginProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("plugin log (run %s):\n%s", run, b)
			}
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, _ := os.ReadFile(logPath); strings.Contains(string(b), `"msg":"Serving plugin"`) {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("plugin exited during startup: %v", p.err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin not serving after 30s")
		}
	}
}

// checkProtocol checks the plugin's answers outside the driver's usual path:
// a handshake without v1alpha1 and a call it did not offer.
func checkProtocol(t *testing.T, sock string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewPluginClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = c.Handshake(ctx, &pb.HandshakeRequest{ProtocolVersions: []string{"v2"}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "v1alpha1") {
		t.Errorf("handshake offering only v2: %v, want FailedPrecondition naming v1alpha1", err)
	}
	hs, err := c.Handshake(ctx, &pb.HandshakeRequest{ProtocolVersions: []string{"v2", "v1alpha1"}})
	if err != nil || hs.GetProtocolVersion() != "v1alpha1" || hs.GetName() != "greeter" {
		t.Errorf("handshake offering v2 and v1alpha1: %v (%v)", hs, err)
	}
	want := []pb.Capability{pb.Capability_CAPABILITY_VALIDATE, pb.Capability_CAPABILITY_CONTENT, pb.Capability_CAPABILITY_AUTHORIZE}
	if !slices.Equal(hs.GetCapabilities(), want) {
		t.Errorf("capabilities %v, want %v", hs.GetCapabilities(), want)
	}
	if _, err := c.Create(ctx, &pb.CreateRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("Create: %v, want Unimplemented", err)
	}
}

// checkVolume checks the files of a published greeter volume.
func checkVolume(t *testing.T, target string, pod *drivertest.Pod, greeting string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(target, "greeting"))
	if err != nil || string(got) != greeting {
		t.Errorf("greeting = %q (%v), want %q", got, err, greeting)
	}
	var id struct{ Namespace, Name, UID, ServiceAccount string }
	b, err := os.ReadFile(filepath.Join(target, "pod.json"))
	if err == nil {
		err = json.Unmarshal(b, &id)
	}
	if err != nil || id.Namespace != pod.Namespace || id.Name != pod.Name || id.UID != pod.UID || id.ServiceAccount != pod.ServiceAccount {
		t.Errorf("pod.json = %s (%v), want the identity of pod %s/%s (%s, service account %q)", b, err, pod.Namespace, pod.Name, pod.UID, pod.ServiceAccount)
	}
	for _, f := range []string{"greeting", "pod.json"} {
		if fi, err := os.Stat(filepath.Join(target, f)); err != nil || fi.Mode().Perm() != 0o444 {
			t.Errorf("%s: mode %v (%v), want 0444", f, fi.Mode(), err)
		}
	}
}

// requireNothingAt checks that a failed publish left no mount and no record
// for the pod's volume.
func requireNothingAt(t *testing.T, h *drivertest.Harness, pod *drivertest.Pod) {
	t.Helper()
	target := h.Kubelet.TargetPath(pod, "hello")
	if fi, err := os.Stat(target); err == nil {
		var pst syscall.Stat_t
		if err := syscall.Stat(filepath.Dir(target), &pst); err == nil && uint64(fi.Sys().(*syscall.Stat_t).Dev) != uint64(pst.Dev) {
			t.Errorf("%s is mounted after a failed publish", target)
		}
	}
	recs, err := h.Driver().Records(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	id := api.VolumeHandle(pod.UID, "hello")
	for _, r := range recs {
		if r.VolumeID == id {
			t.Errorf("record of %s/%s left after a failed publish: phase %s", pod.Namespace, pod.Name, r.Phase)
		}
	}
}
