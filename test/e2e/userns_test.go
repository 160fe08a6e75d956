//go:build e2e && linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// usernsDriverName is the scratch driver TestUserNamespaces runs beside the
// shared one: its own process, state, CSIDriver object (with the tokenfile
// plugin's audience in spec.tokenRequests) and plugin, so that the test runs
// in parallel with the others without restarting the shared driver.
const usernsDriverName = "userns.csi.ephemera.dev"

// The IDs of TestUserNamespaces' fsGroup pods (inside the pod's user namespace).
const (
	usernsUID     = 1000
	usernsGID     = 2000
	usernsFSGroup = 3000
)

// podSubnet is the pod network of every containerd node (writePodNetwork; the
// bridge has no address on the host: no route on the node points into it).
const podSubnet = "10.250.0.0/24"

// podBridge is the Linux bridge of the pod network of the run root (at most
// 15 characters, unique per run root so that concurrent runs do not share one).
func podBridge(root string) string {
	sum := sha256.Sum256([]byte(root))
	return "ephe2e" + hex.EncodeToString(sum[:4])
}

// removePodBridge deletes the run root's pod bridge, if any (cleanupRoot: also
// for the root of a crashed run). The pods' veth pairs go with their network
// namespaces.
func removePodBridge(root string) {
	if _, err := net.InterfaceByName(podBridge(root)); err != nil {
		return
	}
	if out, err := exec.Command("ip", "link", "del", podBridge(root)).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: ip link del %s: %v: %s\n", podBridge(root), err, out)
	}
}

// writePodNetwork gives the node's containerd a pod network, before it starts:
// Debian's containernetworking-plugins (bridge, host-local, loopback;
// install-deps.sh) linked into its CNI bin dir and a bridge network in its conf
// dir. Without one the CRI plugin reports NetworkReady false, the kubelet the
// node not Ready, and the node lifecycle controller taints it (see
// controlplane_test.go). Only TestUserNamespaces' pods use it (the API server
// refuses hostNetwork with hostUsers: false); the others use hostNetwork. The
// nodes of a run share the bridge (podBridge); their host-local ranges are
// their own, so two nodes' pods on it could get one address: only the first
// node runs pods off the host network.
func (n *node) writePodNetwork() error {
	d := filepath.Join(n.dir, "containerd")
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		src := filepath.Join("/usr/lib/cni", p)
		if _, err := os.Stat(src); err != nil {
			return fmt.Errorf("CNI plugin %s: %w (Debian's containernetworking-plugins: run test/e2e/install-deps.sh)", p, err)
		}
		if err := os.Symlink(src, filepath.Join(d, "cni-bin", p)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	conf := filepath.Join(d, "cni-conf", "10-ephemera-e2e.conflist")
	body := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "ephemera-e2e",
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": false,
    "ipMasq": false,
    "hairpinMode": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}
  }]
}
`, podBridge(n.c.root), podSubnet, filepath.Join(d, "cni-ipam"))
	return os.WriteFile(conf, []byte(body), 0o644)
}

// usernsVolume is an inline volume of usernsDriverName.
func usernsVolume(name string, readOnly bool, attrs map[string]string) corev1.Volume {
	v := corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: usernsDriverName, VolumeAttributes: attrs,
	}}}
	if readOnly {
		v.CSI.ReadOnly = ptrTo(true)
	}
	return v
}

// TestUserNamespaces: pods with hostUsers: false (their own user namespace,
// the kubelet's default mapping of 65536 IDs per pod) on containerd 2, through
// the RuntimeClass runc-userns (runc >= 1.2, build-runc.sh), with a pod
// network (writePodNetwork: the API server refuses hostNetwork with
// hostUsers: false while the alpha gate UserNamespacesHostNetworkSupport is
// off). One pod per backend (tmpfs, loop, dir, and the tokenfile plugin as a
// content provider) and per security context (root in the pod, no fsGroup;
// user 1000, group 2000, fsGroup 3000), each with a writable volume at /data
// and a readOnly one at /ro of that backend: whether the pod starts, the
// owner and mode it sees, whether it can write, what the node's disk records
// of its writes, and the content files. docs/operations.md's "User
// namespaces" table is this test's rows.
func TestUserNamespaces(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd || c.ctrd.major != containerd2 {
		t.Skip("user namespaces need containerd >= 2.0 and runc >= 1.2: EPHEMERA_E2E_RUNTIME=containerd with EPHEMERA_E2E_CONTAINERD=2")
	}
	if c.ctrd.usernsRunc == "" {
		t.Fatalf("no runtime handler %s: %v", usernsHandler, c.ctrd.usernsErr)
	}
	shared := requireDriver(t)
	t.Parallel()
	t0 := time.Now()
	ctx := context.Background()

	// Cleanups run last-registered first: the pods go first (registered as
	// they are created), then the driver's records are checked, the driver and
	// the plugin stop.

	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: usernsHandler}, Handler: usernsHandler}
	if _, err := c.cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create RuntimeClass %s: %v", usernsHandler, err)
	}
	t.Cleanup(func() {
		_ = c.cs.NodeV1().RuntimeClasses().Delete(context.Background(), usernsHandler, metav1.DeleteOptions{})
	})

	// The kubelet reports which runtime handlers support user namespaces.
	if err := waitFor(ctx, 30*time.Second, 250*time.Millisecond, "node status lists handler "+usernsHandler+" with user namespaces", func() (bool, error) {
		n, err := c.cs.CoreV1().Nodes().Get(ctx, c.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, h := range n.Status.RuntimeHandlers {
			userns := h.Features != nil && h.Features.UserNamespaces != nil && *h.Features.UserNamespaces
			seen = append(seen, fmt.Sprintf("%q userns=%v", h.Name, userns))
			if h.Name == usernsHandler && userns {
				return true, nil
			}
		}
		return false, fmt.Errorf("runtime handlers: %v", seen)
	}); err != nil {
		t.Fatal(err)
	}

	// The tokenfile plugin and a scratch driver of its own.
	tp := &tokensPlugin{c: c, bin: filepath.Join(c.root, "bin", "tokenfile-userns"), proc: "plugin-tokens-userns",
		endpoint: "unix://" + filepath.Join(c.root, "plugins-userns", "tokens.sock")}
	if err := c.goBuildIn(ctx, filepath.Join(c.repoRoot, "examples/tokenfile"), tp.bin, "."); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if tp.p != nil {
			tp.p.stop(10 * time.Second)
		}
	})
	if err := tp.start(ctx); err != nil {
		t.Fatal(err)
	}
	obj, err := c.csiDriverObject()
	if err != nil {
		t.Fatal(err)
	}
	obj.Name = usernsDriverName
	obj.Spec.TokenRequests = []storagev1.TokenRequest{{Audience: pluginAudience}}
	if _, err := c.cs.StorageV1().CSIDrivers().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSIDriver %s: %v", usernsDriverName, err)
	}
	t.Cleanup(func() {
		_ = c.cs.StorageV1().CSIDrivers().Delete(context.Background(), usernsDriverName, metav1.DeleteOptions{})
	})
	d, err := c.newDriver(&c.node, usernsDriverName, shared.bin, filepath.Join(c.root, "drv-userns"), "driver-userns",
		"--driver-name="+usernsDriverName, "--plugin=tokens="+tp.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	if err := d.start(ctx); err != nil {
		t.Fatal(err)
	}
	var handles []string
	t.Cleanup(func() {
		if !t.Failed() {
			d.assertNoRecords(t, handles...)
		}
	})
	t.Logf("network, RuntimeClass, plugin and driver ready in %v", time.Since(t0).Round(time.Millisecond))

	// The API server refuses hostNetwork with hostUsers: false (the alpha gate
	// UserNamespacesHostNetworkSupport is off): why these pods get a pod network.
	hn := c.newPod("default", "userns-hostnetwork", usernsVolume("rw", false, map[string]string{"size": "1Mi"}), nil)
	hn.Spec.HostUsers = ptrTo(false)
	_, err = c.cs.CoreV1().Pods("default").Create(ctx, hn, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.hostNetwork: Forbidden: when `hostUsers` is false") {
		t.Errorf("hostNetwork: true with hostUsers: false: %v; want Invalid, spec.hostNetwork: Forbidden: when `hostUsers` is false", err)
	}

	// What each backend gives a pod in its own user namespace. The IDs are the
	// ones the pod sees; on the node's disk they are the same (ID-mapped mounts),
	// checked for the written file.
	type view struct {
		root     string // stat of the volume's root: "mode=... uid=... gid=..."
		file     string // stat of the file the pod wrote
		token    string // stat of the content provider's file (content backends)
		hostFile [2]uint32
	}
	backends := []struct {
		name    string
		attrs   map[string]string
		content bool
		plain   view // root in the pod, no fsGroup
		fsGroup view // user 1000, group 2000, fsGroup 3000
	}{
		{"tmpfs", map[string]string{"size": "8Mi"}, false,
			view{root: "mode=1777 uid=0 gid=0", file: "mode=0644 uid=0 gid=0", hostFile: [2]uint32{0, 0}},
			view{root: "mode=3777 uid=0 gid=3000", file: "mode=0644 uid=1000 gid=3000", hostFile: [2]uint32{1000, 3000}}},
		{"loop", map[string]string{"backend": "loop", "size": strconv.Itoa(64 << 20), "fsType": "ext4"}, false,
			view{root: "mode=0777 uid=0 gid=0", file: "mode=0644 uid=0 gid=0", hostFile: [2]uint32{0, 0}},
			view{root: "mode=2775 uid=0 gid=3000", file: "mode=0644 uid=1000 gid=3000", hostFile: [2]uint32{1000, 3000}}},
		{"dir", map[string]string{"backend": "dir"}, false,
			view{root: "mode=0777 uid=0 gid=0", file: "mode=0644 uid=0 gid=0", hostFile: [2]uint32{0, 0}},
			view{root: "mode=2777 uid=0 gid=3000", file: "mode=0644 uid=1000 gid=3000", hostFile: [2]uint32{1000, 3000}}},
		{"tokens", map[string]string{"backend": "tokens", "audience": pluginAudience}, true,
			view{root: "mode=1777 uid=0 gid=0", file: "mode=0644 uid=0 gid=0", token: "mode=0644 uid=0 gid=0", hostFile: [2]uint32{0, 0}},
			view{root: "mode=3777 uid=0 gid=3000", file: "mode=0644 uid=1000 gid=3000", token: "mode=0644 uid=0 gid=3000", hostFile: [2]uint32{1000, 3000}}},
	}
	type row struct {
		name    string
		content bool
		want    view
		rw, ro  corev1.Volume
		nsteps  int
		p       *corev1.Pod
	}
	// Every pod is created first, so that they start together (the test takes
	// about one pod's start), then each row waits and asserts in turn.
	var rows []*row
	for _, b := range backends {
		for _, fsg := range []bool{false, true} {
			r := &row{name: b.name, content: b.content, want: b.plain,
				rw: usernsVolume("rw", false, b.attrs), ro: usernsVolume("ro", true, b.attrs)}
			if fsg {
				r.name += "-fsgroup"
				r.want = b.fsGroup
			}
			args := [][]string{
				st("cat", "/proc/self/uid_map"), st("cat", "/proc/self/mountinfo"),
				st("stat", dataPath), st("write", dataPath+"/f", "16"), st("stat", dataPath+"/f"),
				st("stat", "/ro"), st("write", "/ro/f", "16"),
			}
			if b.content {
				args = append(args, st("stat", dataPath+"/token"), st("read", dataPath+"/token"),
					st("stat", "/ro/token"), st("read", "/ro/token"))
			}
			r.nsteps = len(args)
			args = append(args, st("pause"))
			p := c.newPod("default", "userns-"+r.name, r.rw, steps(args...))
			p.Spec.Volumes = append(p.Spec.Volumes, r.ro)
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: r.ro.Name, MountPath: "/ro"})
			p.Spec.HostNetwork = false
			p.Spec.HostUsers = ptrTo(false)
			p.Spec.RuntimeClassName = ptrTo(usernsHandler)
			if fsg {
				p.Spec.SecurityContext = &corev1.PodSecurityContext{
					RunAsUser: ptrTo(int64(usernsUID)), RunAsGroup: ptrTo(int64(usernsGID)), FSGroup: ptrTo(int64(usernsFSGroup)),
				}
			}
			r.p = c.createPod(t, p)
			handles = append(handles, volumeHandle(string(r.p.UID), r.rw.Name), volumeHandle(string(r.p.UID), r.ro.Name))
			t.Cleanup(func() { c.deletePod(t, r.p, goneTimeout) })
			rows = append(rows, r)
		}
	}
	// The same pod on the default handler (Debian's runc 1.1.5: no ID-mapped
	// mounts) does not start: the kubelet refuses its sandbox.
	def := c.newPod("default", "userns-default-runtime", usernsVolume("rw", false, map[string]string{"size": "1Mi"}), steps(st("pause")))
	def.Spec.HostNetwork = false
	def.Spec.HostUsers = ptrTo(false)
	def = c.createPod(t, def)
	// The kubelet publishes its volume before it asks for the sandbox.
	handles = append(handles, volumeHandle(string(def.UID), "rw"))
	t.Cleanup(func() { c.deletePod(t, def, goneTimeout) })

	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			p := c.waitRunning(t, r.p, runningTimeout)
			out := c.output(t, p, r.nsteps)
			// In a user namespace of its own: container ID 0 is a host ID of the
			// kubelet's range (65536 per pod, from 65536 on: no kubelet user in
			// /etc/subuid, its default mapping).
			m := regexp.MustCompile(`content="\s*0\s+(\d+)\s+65536\\n"$`).FindStringSubmatch(wantStep(t, out, 0, "cat ok"))
			if m == nil {
				t.Fatalf("uid_map: want one line 0 <host ID> 65536: %q", out[0])
			}
			if h, _ := strconv.ParseUint(m[1], 10, 32); h < 65536 || h%65536 != 0 {
				t.Errorf("uid_map maps container ID 0 to host ID %d: want a multiple of 65536, at least 65536", h)
			}
			// Both volumes are ID-mapped mounts (the kernel's "idmapped" mount option).
			mi := wantStep(t, out, 1, "cat ok")
			if q := strings.Index(mi, "content="); q >= 0 {
				if body, err := strconv.Unquote(mi[q+len("content="):]); err == nil {
					for _, mp := range []string{dataPath, "/ro"} {
						opts := ""
						for _, l := range strings.Split(body, "\n") {
							// mountinfo: ID parent major:minor root mountpoint options ...
							if f := strings.Fields(l); len(f) > 5 && f[4] == mp {
								opts = f[5]
							}
						}
						if !strings.Contains(","+opts+",", ",idmapped,") {
							t.Errorf("%s in the container's mountinfo: options %q, want idmapped", mp, opts)
						}
					}
				} else {
					t.Errorf("mountinfo: %v", err)
				}
			}
			wantStep(t, out, 2, "stat ok "+r.want.root)
			wantStep(t, out, 3, "write ok", "size=16")
			wantStep(t, out, 4, "stat ok "+r.want.file)
			wantStep(t, out, 5, "stat ok "+r.want.root)
			wantStep(t, out, 6, "write err EROFS")
			if r.content {
				wantStep(t, out, 7, "stat ok "+r.want.token)
				tok, err := os.ReadFile(filepath.Join(c.hostVolumePath(p, r.rw), "token"))
				if err != nil {
					t.Fatal(err)
				}
				wantStep(t, out, 8, "read ok", fmt.Sprintf("size=%d sha256=%x", len(tok), sha256.Sum256(tok)))
				wantStep(t, out, 9, "stat ok "+r.want.token)
				wantStep(t, out, 10, "read ok size=")
				if aud := jwtAudience(t, string(tok)); aud != pluginAudience {
					t.Errorf("token audience %q, want %q", aud, pluginAudience)
				}
			}
			// The driver cannot tell: the request has no field nor key about the
			// pod's user namespace, only the pod info and the attributes.
			for _, v := range []corev1.Volume{r.rw, r.ro} {
				h := volumeHandle(string(p.UID), v.Name)
				pub := d.rpcLines(0, "NodePublishVolume", h)
				if len(pub) == 0 {
					t.Errorf("%s: no NodePublishVolume for %s in %s", v.Name, h, d.logPath)
				}
				for _, l := range pub {
					fields, keys, err := publishRequest(l)
					if err != nil {
						t.Errorf("%s: %v: %s", v.Name, err, l)
						continue
					}
					for _, f := range fields {
						if !slices.Contains([]string{"volume_id", "target_path", "volume_capability", "readonly", "volume_context"}, f) {
							t.Errorf("%s: NodePublishVolume has field %s: %s", v.Name, f, l)
						}
					}
					for _, k := range keys {
						if _, attr := v.CSI.VolumeAttributes[k]; !attr && !slices.Contains(podInfoKeys, k) {
							t.Errorf("%s: NodePublishVolume's volume_context has %s: %s", v.Name, k, l)
						}
					}
				}
			}
			// The node's disk records the pod's IDs, not the host IDs of its range.
			var hs syscall.Stat_t
			if err := syscall.Stat(filepath.Join(c.hostVolumePath(p, r.rw), "f"), &hs); err != nil {
				t.Error(err)
			} else if [2]uint32{hs.Uid, hs.Gid} != r.want.hostFile {
				t.Errorf("the written file on the node: uid %d gid %d, want %v", hs.Uid, hs.Gid, r.want.hostFile)
			}
			for _, v := range []corev1.Volume{r.rw, r.ro} {
				hm := mountsAt(c.hostVolumePath(p, v))
				if len(hm) != 1 {
					t.Errorf("%s: want one mount at the target, got %+v", v.Name, hm)
					continue
				}
				t.Logf("%s on the node: %s %s (%s)", v.Name, hm[0].FSType, hm[0].Options, hm[0].SuperOpts)
				// nosuid: a set-user-ID file the pod's root writes (owned by 0 on
				// the node's disk) does not run as root on the node.
				o := "," + hm[0].Options + ","
				if hm[0].readOnly() != (v.Name == "ro") || !strings.Contains(o, ",nosuid,") || !strings.Contains(o, ",nodev,") {
					t.Errorf("%s on the node: options %q, want nosuid, nodev and ro only for the readOnly volume", v.Name, hm[0].Options)
				}
			}
		})
	}
	t.Run("default-runtime", func(t *testing.T) {
		msg := c.waitEvent(t, def, regexp.MustCompile("can't set `spec.hostUsers: false`, runtime does not support user namespaces"), runningTimeout)
		t.Logf("event: %s", msg)
		cur, err := c.cs.CoreV1().Pods(def.Namespace).Get(ctx, def.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cur.Status.Phase != corev1.PodPending {
			t.Errorf("pod on the default runtime handler: phase %s, want Pending", cur.Status.Phase)
		}
		n, err := c.cs.CoreV1().Nodes().Get(ctx, c.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range n.Status.RuntimeHandlers {
			if h.Name == "" || h.Name == "runc" {
				if h.Features != nil && h.Features.UserNamespaces != nil && *h.Features.UserNamespaces {
					t.Errorf("runtime handler %q (Debian's runc) reports user namespaces", h.Name)
				}
			}
		}
	})
	t.Logf("TestUserNamespaces: %v until every row was checked", time.Since(t0).Round(time.Millisecond))
}

// podInfoKeys are the volume_context keys the kubelet adds to an inline
// volume's attributes (podInfoOnMount, tokenRequests).
var podInfoKeys = []string{
	"csi.storage.k8s.io/ephemeral", "csi.storage.k8s.io/pod.name", "csi.storage.k8s.io/pod.namespace",
	"csi.storage.k8s.io/pod.uid", "csi.storage.k8s.io/serviceAccount.name", "csi.storage.k8s.io/serviceAccount.tokens",
}

// publishRequest decodes the request of a driver's "Request" log line for
// NodePublishVolume (as publishMount) and returns its fields' names and its
// volume_context's keys, sorted.
func publishRequest(line string) (fields, keys []string, err error) {
	_, q, ok := strings.Cut(line, " request=")
	if !ok {
		return nil, nil, fmt.Errorf("no request= in the log line")
	}
	if q, err = strconv.QuotedPrefix(q); err != nil {
		return nil, nil, fmt.Errorf("request=: %w", err)
	}
	js, err := strconv.Unquote(q)
	if err != nil {
		return nil, nil, fmt.Errorf("request=: %w", err)
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal([]byte(js), &req); err != nil {
		return nil, nil, fmt.Errorf("request JSON: %w", err)
	}
	var vc map[string]any
	if b, ok := req["volume_context"]; ok {
		if err := json.Unmarshal(b, &vc); err != nil {
			return nil, nil, fmt.Errorf("volume_context: %w", err)
		}
	}
	for f := range req {
		fields = append(fields, f)
	}
	for k := range vc {
		keys = append(keys, k)
	}
	slices.Sort(fields)
	slices.Sort(keys)
	return fields, keys, nil
}
