//go:build e2e && linux

package e2e

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pluginAudience is the audience TestPluginPublish adds to the CSIDriver's
// spec.tokenRequests for the tokenfile plugin.
const pluginAudience = "e2e-tokens"

// tokensPlugin is examples/tokenfile in plugin mode ("tokenfile plugin"),
// running as a host process of its own next to the driver.
type tokensPlugin struct {
	c        *cluster
	bin      string
	endpoint string
	proc     string // its process and log name; "" is plugin-tokens
	p        *proc
}

// start starts the plugin and waits until its socket accepts (a killed
// plugin's socket file stays behind, so its existence proves nothing).
func (tp *tokensPlugin) start(ctx context.Context) error {
	return tp.startArgs(ctx, []string{"plugin", "--endpoint=" + tp.endpoint, "--v=4"})
}

// startWith starts another plugin binary (tp.bin) with --endpoint and args.
func (tp *tokensPlugin) startWith(ctx context.Context, args ...string) error {
	return tp.startArgs(ctx, append([]string{"--endpoint=" + tp.endpoint, "--v=4"}, args...))
}

func (tp *tokensPlugin) startArgs(ctx context.Context, args []string) error {
	var err error
	tp.p, err = tp.c.startProc(cmp.Or(tp.proc, "plugin-tokens"), tp.bin, args, nil)
	if err != nil {
		return err
	}
	sock := strings.TrimPrefix(tp.endpoint, "unix://")
	return waitFor(ctx, 30*time.Second, 20*time.Millisecond, "plugin listening on "+sock, func() (bool, error) {
		if tp.p.exited() {
			return false, stop(fmt.Errorf("plugin exited (%v), see %s", tp.p.exitErr(), tp.p.logPath))
		}
		conn, err := net.Dial("unix", sock)
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	})
}

// startWithArgs replaces the running driver with one that has extra
// arguments (--plugin) and waits for its registration. The returned func
// puts the ordinary driver back, unless something (assertNoRecords) did.
func (d *driver) startWithArgs(t *testing.T, extra ...string) func() {
	t.Helper()
	d.stop()
	before := d.registrations()
	var err error
	d.p, err = d.c.startProc("driver", d.bin, append(d.args(true), extra...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.waitRegistered(context.Background(), before); err != nil {
		t.Fatal(err)
	}
	withPlugins := d.p
	return func() {
		if d.p == withPlugins {
			d.stop()
			if err := d.start(context.Background()); err != nil {
				t.Errorf("restart the driver without --plugin: %v", err)
			}
		}
	}
}

// TestPluginPublish: the scratch driver with --plugin tokens=unix://<root>/plugins/tokens.sock
// and examples/tokenfile running as that plugin, a process of its own. A pod
// with "backend: tokens" gets a tmpfs at its target holding its own
// service-account token for the audience, written by the plugin; with the
// plugin killed a new pod stays ContainerCreating with an Unavailable event
// naming the plugin, and starts once the plugin runs again; nothing is left.
func TestPluginPublish(t *testing.T) {
	c := clu
	d := requireDriver(t)
	ctx := context.Background()
	t0 := time.Now()

	tp := &tokensPlugin{c: c, bin: filepath.Join(c.root, "bin", "tokenfile"),
		endpoint: "unix://" + filepath.Join(c.root, "plugins", "tokens.sock")}
	if err := c.goBuildIn(ctx, filepath.Join(c.repoRoot, "examples/tokenfile"), tp.bin, "."); err != nil {
		t.Fatal(err)
	}
	t.Logf("tokenfile built in %v", time.Since(t0).Round(time.Millisecond))
	if err := tp.start(ctx); err != nil {
		t.Fatal(err)
	}
	defer tp.p.stop(10 * time.Second)

	// The driver's CSIDriver asks the kubelet for a token for the plugin's audience.
	obj, err := c.csiDriverObject()
	if err != nil {
		t.Fatal(err)
	}
	cur, err := c.cs.StorageV1().CSIDrivers().Get(ctx, obj.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.TokenRequests = []storagev1.TokenRequest{{Audience: pluginAudience}}
	if _, err := c.cs.StorageV1().CSIDrivers().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("add tokenRequests to the CSIDriver: %v", err)
	}
	defer func() {
		if err := c.applyCSIDriver(context.Background()); err != nil {
			t.Errorf("restore CSIDriver: %v", err)
		}
	}()

	defer d.startWithArgs(t, "--plugin=tokens="+tp.endpoint)()
	logStart := d.logSize()
	t.Logf("driver with --plugin registered %v after the start", time.Since(t0).Round(time.Millisecond))

	vol := csiVolume("tokens", map[string]string{"backend": "tokens", "audience": pluginAudience})
	vol.CSI.ReadOnly = ptrTo(true)
	p := c.createPod(t, c.newPod("default", "plugin-"+randHex(3), vol, steps(
		st("ls", dataPath), st("read", dataPath+"/token"), st("pause"))))
	defer c.deletePod(t, p, goneTimeout)
	p = c.waitRunning(t, p, runningTimeout)
	t.Logf("pod with backend tokens Running %v after the start", time.Since(t0).Round(time.Millisecond))

	m := c.published(t, p, vol)
	if m.FSType != "tmpfs" || !strings.Contains(","+m.SuperOpts+",", ",size=1024k,") || !m.readOnly() {
		t.Errorf("mount at the target: %s %q, read-only %v; want the driver's tmpfs of the plugin's default size 1Mi, read-only", m.FSType, m.SuperOpts, m.readOnly())
	}
	hostToken, err := os.ReadFile(filepath.Join(c.hostVolumePath(p, vol), "token"))
	if err != nil {
		t.Fatal(err)
	}
	if aud := jwtAudience(t, string(hostToken)); aud != pluginAudience {
		t.Errorf("token audience %q, want %q", aud, pluginAudience)
	}
	out := c.output(t, p, 2)
	wantStep(t, out, 0, "ls ok", "token")
	wantStep(t, out, 1, "read ok", fmt.Sprintf("size=%d sha256=%x", len(hostToken), sha256.Sum256(hostToken)))

	// The plugin dies: the next pod's publish fails with Unavailable naming
	// the plugin, and the pod waits in ContainerCreating.
	tp.p.kill()
	p2 := c.createPod(t, c.newPod("default", "plugin-down-"+randHex(3), vol, steps(st("read", dataPath+"/token"), st("pause"))))
	defer c.deletePod(t, p2, goneTimeout)
	msg := c.waitEvent(t, p2, regexp.MustCompile(`Unavailable.*plugin tokens`), 60*time.Second)
	t.Logf("event with the plugin down: %s", msg)
	if cur, err := c.cs.CoreV1().Pods(p2.Namespace).Get(ctx, p2.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if w := waitingReason(cur); cur.Status.Phase != corev1.PodPending || w != "ContainerCreating" {
		t.Errorf("pod with the plugin down: phase %s, waiting %q; want Pending, ContainerCreating", cur.Status.Phase, w)
	}
	if ms := mountsUnder(c.hostVolumePath(p2, vol)); len(ms) > 0 {
		t.Errorf("refused volume is mounted: %+v", ms)
	}
	// The running pod keeps its volume.
	if _, err := os.Stat(filepath.Join(c.hostVolumePath(p, vol), "token")); err != nil {
		t.Errorf("the running pod's token with the plugin down: %v", err)
	}

	// The plugin runs again: the kubelet's retry publishes the waiting pod.
	t1 := time.Now()
	if err := tp.start(ctx); err != nil {
		t.Fatal(err)
	}
	p2 = c.waitRunning(t, p2, runningTimeout)
	t.Logf("waiting pod Running %v after the plugin restarted", time.Since(t1).Round(time.Millisecond))
	wantStep(t, c.output(t, p2, 1), 0, "read ok")

	// Tokens reach the volume only: neither the driver nor the plugin logs them.
	tok2, _ := os.ReadFile(filepath.Join(c.hostVolumePath(p2, vol), "token"))
	for _, tok := range [][]byte{hostToken, tok2} {
		sig := string(tok)[strings.LastIndex(string(tok), ".")+1:]
		if len(sig) < 16 {
			t.Errorf("token %q has no signature", tok)
			continue
		}
		if strings.Contains(d.logSince(logStart), sig) {
			t.Error("the driver logged a token")
		}
		if b, _ := os.ReadFile(tp.p.logPath); strings.Contains(string(b), sig) {
			t.Error("the plugin logged a token")
		}
	}

	// Cleanup: targets, records, then the plugin's socket.
	c.deletePod(t, p, goneTimeout)
	c.deletePod(t, p2, goneTimeout)
	c.cleanedUp(t, p, vol)
	c.cleanedUp(t, p2, vol)
	d.assertNoRecords(t, volumeHandle(string(p.UID), vol.Name), volumeHandle(string(p2.UID), vol.Name))
	tp.p.stop(10 * time.Second)
	if ents, err := os.ReadDir(filepath.Dir(strings.TrimPrefix(tp.endpoint, "unix://"))); err != nil || len(ents) != 0 {
		t.Errorf("plugin socket directory after the plugin stopped: %v %v, want empty", ents, err)
	}
	t.Logf("TestPluginPublish: %v in all", time.Since(t0).Round(time.Millisecond))
}

// waitingReason is the first container's waiting reason.
func waitingReason(p *corev1.Pod) string {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Waiting != nil {
			return s.State.Waiting.Reason
		}
	}
	return ""
}

// jwtAudience returns the first "aud" of a JWT's payload (not verified: the
// API server issued it; this only checks which audience the plugin wrote).
func jwtAudience(t *testing.T, tok string) string {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(tok), ".")
	if len(parts) != 3 {
		t.Fatalf("token is not a JWT (%d parts)", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("token payload: %v", err)
	}
	var claims struct {
		Aud []string `json:"aud"`
	}
	if err := json.Unmarshal(b, &claims); err != nil || len(claims.Aud) == 0 {
		t.Fatalf("token claims %s: %v", b, err)
	}
	return claims.Aud[0]
}

// The plugin deployments' rendered targets (test/manifests) must be present
// for TestDeployManifestsDryRun, which applies every rendered file.
func init() {
	wantManifests = append(wantManifests,
		"kustomize-linux-plugin-sidecar.yaml", "kustomize-plugin-daemonset.yaml", "helm-plugins.yaml")
}
