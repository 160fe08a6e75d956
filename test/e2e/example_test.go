//go:build e2e && linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// The example driver TestExampleFromChart deploys with the generic chart.
const (
	helloDir    = "examples/hello"
	helloDriver = "hello.csi.ephemera.dev" // Options.DriverName in examples/hello/main.go
	// The test/manifests target that renders the chart with examples/hello/values.yaml.
	helloTarget = "helm-example-hello"
	// Where examples/hello/pod.yaml runs: a namespace with hello's admission label.
	helloPodNS = "e2e-hello"
	// Where deploy/images/Dockerfile.driver puts a driver (its entrypoint).
	driverInImage = "usr/local/bin/driver"
)

// exampleStateRoot is the chart's stateRoot for the run root root: outside /tmp
// (values.schema.json refuses it there), one per run root; cleanupRoot removes it.
func exampleStateRoot(root string) string {
	sum := sha256.Sum256([]byte(root))
	return filepath.Join("/var/lib/ephemera-e2e", hex.EncodeToString(sum[:6]))
}

// exampleStateDir makes the directory name below the run's exampleStateRoot (the
// chart refuses a state root below /tmp; cleanupRoot removes it after a crashed
// run) and removes it when the test ends.
func (c *cluster) exampleStateDir(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(exampleStateRoot(c.root), name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// decodeFile decodes the first YAML document of path into out.
func decodeFile(path string, out any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := utilyaml.NewYAMLOrJSONDecoder(f, 4096).Decode(out); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// TestExampleFromChart deploys examples/hello on the node from the generic chart
// (deploy/helm/ephemera-driver with examples/hello/values.yaml), as a DaemonSet pod
// under containerd and runc, next to the harness's scratch driver: hello is built
// statically from its own module and imported under the image its values name; the
// chart is rendered with the node's kubelet root, the embedded registrar and a
// free metrics port, and its objects are applied for real: the DaemonSet controller
// makes its pod and kube-scheduler binds it. The node's pod network is not reachable
// from the host (its bridge has no address there), so the template gets
// hostNetwork: true (the one change to the rendered objects) for the kubelet's
// readiness probe. The kubelet registers hello through the privileged container
// (CSINode lists it, the readiness probe passes);
// examples/hello/pod.yaml, with the harness's image, reads its own identity from
// hello's volume, which the driver mounted inside its container and which reached
// the host through Bidirectional propagation. Deleting pods and objects leaves
// nothing of hello below the kubelet root.
func TestExampleFromChart(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("runs the driver in a container: EPHEMERA_E2E_RUNTIME=containerd")
	}
	requireDriver(t) // the scratch driver runs too: the two must not collide
	ctx := context.Background()
	dir := filepath.Join(c.root, "hello")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()

	// The image: examples/hello built statically, at the path and under the tag
	// its Dockerfile and values.yaml name.
	var vals struct {
		Driver struct{ Name string }
		Image  struct{ Repository, Tag string }
	}
	if err := decodeFile(filepath.Join(c.repoRoot, helloDir, "values.yaml"), &vals); err != nil {
		t.Fatal(err)
	}
	if vals.Driver.Name != helloDriver || vals.Image.Repository == "" || vals.Image.Tag == "" {
		t.Fatalf("%s/values.yaml: driver.name %q, image %q:%q", helloDir, vals.Driver.Name, vals.Image.Repository, vals.Image.Tag)
	}
	image := vals.Image.Repository + ":" + vals.Image.Tag
	bin := filepath.Join(c.root, "bin", "hello")
	if err := c.goBuildIn(ctx, filepath.Join(c.repoRoot, helloDir), bin, "."); err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(dir, "image.tar")
	if err := writeImageArchive(tarPath, bin, driverInImage, map[string][]string{image: nil}); err != nil {
		t.Fatal(err)
	}
	if out, err := c.ctr(ctx, "images", "import", tarPath); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	c.step("hello built and imported as "+image, t0)

	// The chart, rendered for this node.
	t1 := time.Now()
	valuesFile, stateRoot := c.chartValuesForNode(t, dir)
	if b, err := c.render("-out", dir, "-target", helloTarget, "-values", valuesFile).CombinedOutput(); err != nil {
		t.Fatalf("render %s: %v\n%s", helloTarget, err, b)
	}
	objs, err := readObjects(filepath.Join(dir, helloTarget+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c.step(fmt.Sprintf("chart rendered for hello (%d objects)", len(objs)), t1)

	t2 := time.Now()
	var appPod *corev1.Pod
	d := c.deployChartDriver(t, helloDriver, objs, stateRoot, func() *corev1.Pod { return appPod })
	drvPod := d.pod
	c.step("hello applied, its pod Running, Ready and registered", t2)

	// examples/hello/pod.yaml with the harness's image: testbin reads what the
	// pod's command cats, then waits.
	t3 := time.Now()
	var admission struct {
		Admission struct{ NamespaceLabel struct{ Key, Value string } }
	}
	if err := decodeFile(filepath.Join(c.repoRoot, helloDir, "values.yaml"), &admission); err != nil {
		t.Fatal(err)
	}
	c.allowInline(t, helloPodNS, admission.Admission.NamespaceLabel.Key, admission.Admission.NamespaceLabel.Value)
	var p corev1.Pod
	if err := decodeFile(filepath.Join(c.repoRoot, helloDir, "pod.yaml"), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Containers) != 1 || len(p.Spec.Containers[0].VolumeMounts) != 1 || len(p.Spec.Volumes) != 1 ||
		p.Spec.Volumes[0].CSI == nil || p.Spec.Volumes[0].CSI.Driver != helloDriver {
		t.Fatalf("%s/pod.yaml: want one container and one inline volume of %s", helloDir, helloDriver)
	}
	mnt := p.Spec.Containers[0].VolumeMounts[0].MountPath
	c.onThisNode(&p, helloPodNS, steps(st("read", mnt+"/namespace"), st("read", mnt+"/name"), st("pause")))
	appPod = c.createPod(t, &p)
	appPod = c.waitRunning(t, appPod, runningTimeout)
	vol := appPod.Spec.Volumes[0]
	c.step("hello's example pod Running", t3)

	out := c.output(t, appPod, 2)
	wantStep(t, out, 0, "read ok", fmt.Sprintf("content=%q", helloPodNS))
	wantStep(t, out, 1, "read ok", fmt.Sprintf("content=%q", appPod.Name))
	out = c.exec(t, appPod, steps(st("read", mnt+"/uid"), st("read", mnt+"/serviceaccount"),
		st("ls", mnt), st("write", mnt+"/x", "1"))...)
	wantStep(t, out, 0, "read ok", fmt.Sprintf("content=%q", string(appPod.UID)))
	wantStep(t, out, 1, "read ok", `content="default"`)
	wantStep(t, out, 2, "ls ok", "name", "namespace", "serviceaccount", "uid")
	wantStep(t, out, 3, "write err EROFS")
	t.Logf("container sees: %q", out)
	target := c.hostVolumePath(appPod, vol)
	if ms := mountsAt(target); len(ms) != 1 || ms[0].FSType != "tmpfs" {
		t.Errorf("host mounts at %s: %+v, want one tmpfs (hello's, propagated from its container)", target, ms)
	}
	if c.podCgroups && cgroupV1Mount("memory") != "" {
		c.helloChargesPod(t, drvPod, appPod)
	}

	// Delete the app pod: hello unpublishes (the kubelet deletes the object only
	// after TearDown), and its mount and pod directory go; then hello itself.
	t4 := time.Now()
	c.deletePod(t, appPod, goneTimeout)
	c.cleanedUp(t, appPod, vol)
	c.removeChartDriver(t, d, appPod)
	appPod = nil
	c.step("hello's pods and objects deleted, nothing left", t4)
}

// chartValuesForNode writes the values that make the generic chart's objects run
// on this node into dir/values-e2e.yaml (applied over a driver's own values): the
// node's kubelet root, a state root of its own, the embedded registrar (no
// node-driver-registrar image offline), images never pulled, a free metrics port
// (host network), this node only. It returns the file and the state root (below
// the run root's, which cleanupRoot removes after a crashed run).
func (c *cluster) chartValuesForNode(t *testing.T, dir string) (valuesFile, stateRoot string) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	stateRoot = filepath.Join(exampleStateRoot(c.root), filepath.Base(dir))
	over := map[string]any{
		"kubeletRoot": c.kubeletRoot,
		"stateRoot":   stateRoot,
		"registrar":   map[string]any{"mode": "embedded"},
		"image":       map[string]any{"pullPolicy": "Never"},
		// Host network (deployChartDriver): a port of its own, not 9809 of every node.
		"metrics":      map[string]any{"port": port},
		"nodeSelector": map[string]any{"kubernetes.io/hostname": nodeName},
		"logLevel":     4,
	}
	if c.podCgroups {
		// The kubelet's cgroupRoot, as an operator sets it for a kubelet
		// whose --cgroup-root is not "/".
		over["podCgroups"] = map[string]any{"kubeletCgroupRoot": c.cgroupRoot}
	}
	vb, _ := json.Marshal(over)
	valuesFile = filepath.Join(dir, "values-e2e.yaml")
	if err := os.WriteFile(valuesFile, vb, 0o644); err != nil {
		t.Fatal(err)
	}
	return valuesFile, stateRoot
}

// chartDriver is a driver the generic chart deployed on the node.
type chartDriver struct {
	name      string                       // its CSI driver name
	objs      []*unstructured.Unstructured // the chart's objects, applied
	ds        *unstructured.Unstructured   // its node-plugin DaemonSet
	pod       *corev1.Pod                  // the DaemonSet's pod on the node
	stateRoot string
}

// deployChartDriver applies a driver's rendered chart objects for real (the
// DaemonSet controller makes its pod, kube-scheduler binds it) and waits until
// its pod runs, is Ready and the kubelet registered the driver (CSINode lists
// it). The node's pod network is not reachable from the host (its bridge has no
// address there), so the template gets hostNetwork: true, the one change to the
// objects, for the kubelet's readiness probe. Cleanup, also when the test fails
// midway, goes in dependency order: the app pod appPod returns while the driver
// still runs (its unpublish needs the driver), then the DaemonSet and its pod,
// then the objects and the state.
func (c *cluster) deployChartDriver(t *testing.T, name string, objs []*unstructured.Unstructured, stateRoot string, appPod func() *corev1.Pod) *chartDriver {
	t.Helper()
	ctx := context.Background()
	d := &chartDriver{name: name, objs: objs, stateRoot: stateRoot}
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			d.ds = o
		}
	}
	if d.ds == nil {
		t.Fatalf("%s: no DaemonSet among %d objects", name, len(objs))
	}
	if err := unstructured.SetNestedField(d.ds.Object, true, "spec", "template", "spec", "hostNetwork"); err != nil {
		t.Fatal(err)
	}
	a := c.newApplier(t)
	t.Cleanup(func() {
		if p := appPod(); p != nil {
			c.deletePod(t, p, goneTimeout)
		}
		c.deleteDaemonSet(t, d.ds.GetNamespace(), d.ds.GetName(), goneTimeout)
		for i := len(objs) - 1; i >= 0; i-- {
			if err := a.delete(ctx, objs[i]); err != nil {
				t.Errorf("delete %s: %v", describe(objs[i]), err)
			}
		}
		if err := os.RemoveAll(stateRoot); err != nil {
			t.Error(err)
		}
	})
	before := countInFile(c.kubelet.logPath, "Register new plugin with name: "+name+" ")
	for _, o := range objs {
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", describe(o), err)
		}
	}
	d.pod = c.daemonSetPod(t, d.ds.GetNamespace(), d.ds.GetName(), nodeName)
	d.pod = c.waitRunning(t, d.pod, runningTimeout)
	err := waitFor(ctx, 60*time.Second, 100*time.Millisecond, "kubelet registered "+name+" and CSINode lists it", func() (bool, error) {
		if countInFile(c.kubelet.logPath, "Register new plugin with name: "+name+" ") <= before {
			return false, nil
		}
		return csiNodeLists(ctx, c, name)
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, c.podEvents(d.pod))
	}
	// The kubelet's readiness probe reaches the chart's /readyz on the metrics port.
	c.waitPodReady(t, d.pod, 30*time.Second)
	if ok, _ := csiNodeLists(ctx, c, driverName); !ok {
		t.Errorf("CSINode no longer lists %s next to %s", driverName, name)
	}
	return d
}

// removeChartDriver deletes a chart driver whose app pods (gone already) are
// given: the DaemonSet (the garbage collector deletes its pod, the embedded
// registrar removes its socket, the kubelet deregisters the driver), then the
// chart's other objects; and checks that nothing of it is left below the
// kubelet root: no mount of its pod or of the app pods, no pod directory (the
// kubelet removes it at housekeeping), no socket, and that the harness's
// driver is still registered.
func (c *cluster) removeChartDriver(t *testing.T, d *chartDriver, appPods ...*corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	c.deleteDaemonSet(t, d.ds.GetNamespace(), d.ds.GetName(), goneTimeout)
	err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "CSINode without "+d.name, func() (bool, error) {
		ok, err := csiNodeLists(ctx, c, d.name)
		return !ok, err
	})
	if err != nil {
		t.Error(err)
	}
	a := c.newApplier(t)
	for i := len(d.objs) - 1; i >= 0; i-- {
		if err := a.delete(ctx, d.objs[i]); err != nil {
			t.Errorf("delete %s: %v", describe(d.objs[i]), err)
		}
	}
	if _, err := c.cs.StorageV1().CSIDrivers().Get(ctx, d.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("CSIDriver %s: get says %v after delete, want NotFound", d.name, err)
	}
	uids := []string{string(d.pod.UID)}
	for _, p := range appPods {
		uids = append(uids, string(p.UID))
	}
	pluginDir := filepath.Join(c.kubeletRoot, "plugins", d.name)
	err = waitFor(ctx, 30*time.Second, 200*time.Millisecond, "nothing of "+d.name+" left below "+c.kubeletRoot, func() (bool, error) {
		for _, m := range mountsUnder(c.kubeletRoot) {
			if strings.Contains(m.MountPoint, d.name) {
				return false, fmt.Errorf("mount left: %s (%s)", m.MountPoint, m.FSType)
			}
			for _, uid := range uids {
				if strings.Contains(m.MountPoint, uid) {
					return false, fmt.Errorf("mount left: %s (%s)", m.MountPoint, m.FSType)
				}
			}
		}
		for _, uid := range uids {
			if _, err := os.Lstat(filepath.Join(c.kubeletRoot, "pods", uid)); err == nil {
				return false, fmt.Errorf("pod directory %s left", filepath.Join(c.kubeletRoot, "pods", uid))
			}
		}
		if ents, _ := os.ReadDir(pluginDir); len(ents) > 0 {
			return false, fmt.Errorf("%s not empty: %s", pluginDir, ents[0].Name())
		}
		reg, _ := filepath.Glob(filepath.Join(c.kubeletRoot, "plugins_registry", d.name+"*"))
		if len(reg) > 0 {
			return false, fmt.Errorf("registration socket left: %v", reg)
		}
		return true, nil
	})
	if err != nil {
		t.Error(err)
	}
	if ok, _ := csiNodeLists(ctx, c, driverName); !ok {
		t.Errorf("CSINode no longer lists %s after %s left", driverName, d.name)
	}
}

// allowInline makes namespace ns (created when missing) one whose pods the
// admission policy lets use a chart driver inline: its namespace label.
func (c *cluster) allowInline(t *testing.T, ns, key, value string) {
	t.Helper()
	ctx := context.Background()
	if err := c.ensureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := c.cs.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// onThisNode makes a pod of an example's pod.yaml run here, in namespace ns: bound
// to the node, host network (the node's pod network is not reachable), a short
// grace period, and its one container the harness's image running testbin with
// args instead of the example's command.
func (c *cluster) onThisNode(p *corev1.Pod, ns string, args []string) {
	grace, no := int64(1), false
	p.Namespace = ns
	p.Spec.NodeName = nodeName
	p.Spec.HostNetwork = true
	p.Spec.DNSPolicy = corev1.DNSDefault
	p.Spec.EnableServiceLinks = &no
	p.Spec.TerminationGracePeriodSeconds = &grace
	ctn := &p.Spec.Containers[0]
	ctn.Image, ctn.ImagePullPolicy = c.testImage, corev1.PullNever
	ctn.Command = []string{"/testbin"}
	ctn.Args = args
}

// csiNodeLists reports whether the node's CSINode object lists the driver name.
func csiNodeLists(ctx context.Context, c *cluster, name string) (bool, error) {
	n, err := c.cs.StorageV1().CSINodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	for _, x := range n.Spec.Drivers {
		if x.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// helloChargesPod checks that hello, in its container with the host's cgroup
// tree at /host/sys/fs/cgroup (the chart's mount) and the node's cgroupRoot,
// charges the content it wrote to the app pod (issue 44): its start line says
// mode pod-cgroup, and the app pod's memory cgroup holds the pages of its
// four files (a page each at least).
func (c *cluster) helloChargesPod(t *testing.T, drvPod, appPod *corev1.Pod) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.podLogsDir, fmt.Sprintf("%s_%s_%s", drvPod.Namespace, drvPod.Name, drvPod.UID), "driver", "0.log"))
	if err != nil {
		t.Errorf("hello's container log: %v", err)
		return
	}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"Charging content in memory-backed volumes"`) {
			line = l
		}
	}
	if !strings.Contains(line, `mode="pod-cgroup"`) {
		t.Errorf("hello's start line %q, want mode=\"pod-cgroup\" (the host's cgroup tree mounted, --kubelet-cgroup-root=%s)", line, c.cgroupRoot)
	}
	cur, err := c.cs.CoreV1().Pods(appPod.Namespace).Get(context.Background(), appPod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cg := c.podMemoryCgroup(cur)
	if shmem := mustMemoryCounter(t, cg, "total_shmem"); shmem < 4*4096 {
		t.Errorf("app pod's memory cgroup %s: total_shmem %d, want the pages of hello's 4 files (at least %d) charged to it", cg, shmem, 4*4096)
	} else {
		t.Logf("hello's app pod: its memory cgroup holds %d bytes of shmem", shmem)
	}
}
