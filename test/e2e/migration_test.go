//go:build e2e && linux

package e2e

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ephemera-csi/ephemera/framework"
)

// migrationNS holds TestShippedImageMigration's pods.
const migrationNS = "e2e-migration"

// deployment is one way of installing the scratch driver, rendered for this node.
type deployment struct {
	name string // the render target
	objs []*unstructured.Unstructured
	ds   *unstructured.Unstructured
}

// TestShippedImageMigration installs the shipped image from a real registry and
// moves one node between the two ways of deploying it, as docs/operations.md
// ("Moving between kustomize and the chart") tells an operator to:
//
//   - make image's index is pushed to the registry; a pod naming a wrong digest
//     of it ends in ImagePullBackOff;
//   - without the registry first: a release of the index built (cmd/release),
//     its archive imported with ctr -n k8s.io images import --all-platforms
//     (installFromRelease), the release's Linux manifests applied unchanged
//     (REPO:VERSION@DIGEST, IfNotPresent), the node plugin started from the
//     node's image store without a pull (wantNoPull), a volume published and
//     unpublished;
//   - deploy/overlays/linux-embedded-registrar with the image set by digest
//     (what `kustomize edit set image` writes), its DaemonSet's pod pulled by
//     containerd through the kubelet; a pod's volume published by it;
//   - to the chart (image.repository and image.digest): the kustomize DaemonSet
//     deleted first, the chart's applied, its pod started; the first pod's volume
//     stays mounted and readable throughout, and the chart's driver unpublishes
//     it; a second node-plugin pod on the node (maxSurge, or a DaemonSet left
//     behind) refuses to start and never registers;
//   - and back to kustomize the same way, with a volume the chart's driver
//     published.
//
// A watcher samples the kubelet's registration directory every 10 ms: at no time
// are two registration sockets of the driver there, and the kubelet registers
// the driver exactly once per node-plugin pod. The harness's own scratch driver
// (a host process of the same name) is stopped meanwhile.
//
// The DaemonSet controller makes each DaemonSet's pod and kube-scheduler binds
// it (daemonSetPod); the garbage collector deletes it with its DaemonSet; the
// root-CA publisher makes the kube-root-ca.crt its token volume needs. The
// second node plugin is a pod of the chart's template owned by nothing
// (podFromTemplate), as a DaemonSet left behind would run it. forThisNode lists
// the other changes to the rendered objects (kubelet root, host network, the
// API server's address).
func TestShippedImageMigration(t *testing.T) {
	// The only parallel test of the suite: Go runs it after every sequential test
	// has finished, alone. In make test the image builds beside the e2e
	// (requireShippedImage waits for it), so this test comes last.
	t.Parallel()
	c := clu
	reg := requireRegistry(t)
	img := requireShippedImage(t)
	drv := requireDriver(t)
	ctx := context.Background()

	t0 := time.Now()
	repo := reg.push(t, img, "ephemera/ephemera-scratch", "e2e")
	ref := repo + "@" + img.digest
	c.step("make image's index pushed to "+reg.host, t0)

	// A digest the registry does not have: the kubelet's ImagePullBackOff.
	t1 := time.Now()
	wrong := c.newPod("default", "wrong-digest-"+randHex(3), memoryEmptyDir("data"), nil)
	wrong.Spec.Containers[0].Image = repo + "@sha256:" + strings.Repeat("0", 64)
	wrong.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
	wrong = c.createPod(t, wrong)
	msg := c.waitImagePullBackOff(t, wrong, time.Minute)
	if !strings.Contains(msg, repo) {
		t.Errorf("ImagePullBackOff message %q does not name %s", msg, repo)
	}
	c.deletePod(t, wrong, goneTimeout)
	c.step("wrong digest: ImagePullBackOff", t1)

	dir := filepath.Join(c.root, "migration")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stateRoot := c.exampleStateDir(t, "migration")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	kust := c.renderDeployment(t, dir, "kustomize-linux-embedded-registrar", nil)
	chart := c.renderDeployment(t, dir, "helm-embedded-registrar", map[string]any{
		"kubeletRoot": c.kubeletRoot,
		"stateRoot":   stateRoot,
		"image":       map[string]any{"repository": repo, "digest": img.digest},
		"metrics":     map[string]any{"port": port},
		"logLevel":    4,
	})
	if err := c.forThisNode(kust.ds, stateRoot, ref, port); err != nil {
		t.Fatal(err)
	}
	if err := c.forThisNode(chart.ds, "", "", port); err != nil { // paths and image from the values
		t.Fatal(err)
	}
	if k, h := driverArg(kust.ds, "--state-dir="), driverArg(chart.ds, "--state-dir="); k != h || k == "" {
		t.Fatalf("state directories differ: kustomize %q, the chart %q", k, h)
	}
	if got := driverImage(chart.ds); got != ref {
		t.Fatalf("the chart with image.repository=%s, image.digest=%s renders the image %q, want %q", repo, img.digest, got, ref)
	}
	ns := kust.ds.GetNamespace()
	if ns != chart.ds.GetNamespace() || kust.ds.GetName() != chart.ds.GetName() {
		t.Fatalf("kustomize's DaemonSet is %s/%s, the chart's %s/%s: the migration assumes one name",
			ns, kust.ds.GetName(), chart.ds.GetNamespace(), chart.ds.GetName())
	}
	if err := c.ensureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// The pods' namespace may use the driver inline under the chart's admission
	// policy (the overlays ship it separately, deploy/admission).
	if err := c.ensureNamespace(ctx, migrationNS); err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, scratchAllowedLabel)
	if _, err := c.cs.CoreV1().Namespaces().Patch(ctx, migrationNS, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	regDir := filepath.Join(c.kubeletRoot, "plugins_registry")
	registrations := func() int { return countInFile(c.kubelet.logPath, "Register new plugin with name: "+driverName+" ") }
	a := c.newApplier(t)
	var (
		apps, plugins []*corev1.Pod // live pods, deleted at cleanup: apps first
		applied       []*unstructured.Unstructured
	)
	// Apps whose node plugin was gone when the test failed: the harness's driver,
	// running again, unpublishes them.
	t.Cleanup(func() {
		for _, p := range apps {
			c.waitPodGone(t, p, goneTimeout)
		}
	})
	drv.withDriverStopped(t, func() {
		w := watchRegistrations(regDir, driverName)
		defer func() {
			wait := time.Duration(0)
			if len(plugins) > 0 {
				wait = goneTimeout
			}
			for _, p := range apps {
				c.deletePod(t, p, wait)
			}
			if wait > 0 {
				apps = nil
			}
			// The DaemonSets first: the controller would make a deleted pod of
			// a DaemonSet that is still there again.
			for _, o := range applied {
				if o.GetKind() == "DaemonSet" {
					c.deleteDaemonSet(t, o.GetNamespace(), o.GetName(), 0)
				}
			}
			for _, p := range plugins {
				c.deletePod(t, p, goneTimeout)
			}
			c.undeploy(t, a, applied, w, regDir)
		}()
		forget := func(p *corev1.Pod) {
			del := func(q *corev1.Pod) bool { return q.UID == p.UID }
			apps, plugins = slices.DeleteFunc(apps, del), slices.DeleteFunc(plugins, del)
		}
		// install applies a deployment's objects and starts its node plugin.
		install := func(dep deployment) *corev1.Pod {
			t.Helper()
			t0 := time.Now()
			before := registrations()
			for _, o := range dep.objs {
				if err := a.apply(ctx, o, false); err != nil {
					t.Fatalf("%s: apply %s: %v", dep.name, describe(o), err)
				}
				applied = append(applied, o)
			}
			p := c.daemonSetPod(t, ns, dep.ds.GetName(), nodeName)
			plugins = append(plugins, p)
			p = c.waitRunning(t, p, runningTimeout)
			if got := p.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(got, img.digest) {
				t.Errorf("%s: the driver runs image %q, want make image's index %s", dep.name, got, img.digest)
			}
			err := waitFor(ctx, 60*time.Second, 100*time.Millisecond, dep.name+": kubelet registered "+driverName, func() (bool, error) {
				if registrations() <= before {
					return false, nil
				}
				return csiNodeLists(ctx, c, driverName)
			})
			if err != nil {
				t.Fatalf("%v\nevents:\n%s", err, c.podEvents(p))
			}
			c.waitPodReady(t, p, 30*time.Second)
			// The manifests pass the container's memory limit through the downward
			// API; the driver sets Go's from it, less --content-capacity
			// (framework.GoMemoryLimit), and gave its startup pages back before Ready.
			log := c.containerLogText(p)
			if err := memoryPlanLogged(dep.ds, log); err != nil {
				t.Errorf("%s: %v:\n%s", dep.name, err, log)
			}
			if want := `"Released the binary's startup pages"`; !strings.Contains(log, want) {
				t.Errorf("%s: the driver's log lacks %s:\n%s", dep.name, want, log)
			}
			if n := registrations() - before; n != 1 {
				t.Errorf("%s: the kubelet registered %s %d times for one node plugin", dep.name, driverName, n)
			}
			from := "pulled from the registry"
			if dep.name == "release" {
				from = "from the imported archive"
			}
			c.step(dep.name+": node plugin "+from+", Running, Ready, registered", t0)
			return p
		}
		// uninstall deletes a deployment's DaemonSet (the objects the other keeps
		// stay, as after an adoption by Helm), waits until the garbage collector
		// has deleted its pod and the kubelet no longer has the driver.
		uninstall := func(dep deployment, p *corev1.Pod) {
			t.Helper()
			t0 := time.Now()
			c.deleteDaemonSet(t, ns, dep.ds.GetName(), goneTimeout)
			c.waitPodGone(t, p, goneTimeout)
			forget(p)
			err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, dep.name+": CSINode without "+driverName, func() (bool, error) {
				ok, err := csiNodeLists(ctx, c, driverName)
				return !ok, err
			})
			if err != nil {
				t.Fatal(err)
			}
			c.step(dep.name+": DaemonSet and its pod deleted, driver deregistered", t0)
		}
		// app starts a pod with a volume and writes its name into it.
		app := func(name string) (*corev1.Pod, corev1.Volume) {
			t.Helper()
			vol := csiVolume("data", map[string]string{"size": "16Mi"})
			p := c.createPod(t, c.newPod(migrationNS, name+"-"+randHex(3), vol, steps(st("append", dataPath+"/by", name), st("pause"))))
			apps = append(apps, p)
			p = c.waitRunning(t, p, runningTimeout)
			wantStep(t, c.output(t, p, 1), 0, "append ok")
			return p, vol
		}
		// survives checks that a pod's volume is mounted once and holds what was
		// written.
		survives := func(p *corev1.Pod, vol corev1.Volume, want, when string) {
			t.Helper()
			if ms := mountsAt(c.hostVolumePath(p, vol)); len(ms) != 1 || ms[0].FSType != "tmpfs" {
				t.Errorf("%s: %s's volume: mounts %+v, want one tmpfs", when, p.Name, ms)
			}
			out := c.exec(t, p, steps(st("read", dataPath+"/by"))...)
			wantStep(t, out, 0, "read ok", fmt.Sprintf("content=%q", want+"\n"))
		}
		// done deletes an app pod and checks its volume is gone from the node.
		done := func(p *corev1.Pod, vol corev1.Volume) {
			t.Helper()
			c.deletePod(t, p, goneTimeout)
			forget(p)
			c.cleanedUp(t, p, vol)
		}

		// Registry-less first (docs/operations.md, "Installing a release"): the
		// release's image archive imported into the node's containerd as an
		// operator does (ctr -n k8s.io images import --all-platforms: the whole
		// index with its SBOM artifacts), and the release's manifests applied as
		// they are: their image, localhost/ephemera-scratch:VERSION@sha256:<index>,
		// IfNotPresent, is found in the node's image store and never pulled
		// (localhost serves no registry: a pull would fail). First, because the
		// kubelet (KubeletEnsureSecretPulledImages, on since 1.35) treats an image
		// it has pulled before under another name (the registry's, below) as not
		// preloaded and pulls it again under the new name.
		rel := c.installFromRelease(t, dir, stateRoot, port, img)
		r1 := install(rel)
		c.wantNoPull(t, r1)
		app3, vol3 := app("release")
		done(app3, vol3)
		uninstall(rel, r1)

		k1 := install(kust)
		app1, vol1 := app("kustomize")

		uninstall(kust, k1)
		survives(app1, vol1, "kustomize", "no node plugin")
		h1 := install(chart)
		survives(app1, vol1, "kustomize", "after the move to the chart")

		// A second node plugin of the driver on the node refuses to start: it
		// never registers, and the first keeps serving.
		t2 := time.Now()
		before := registrations()
		// On the pod network its metrics port would be its own; on the host
		// network of this node the kubelet would refuse the pod (NodePorts) before
		// the driver could refuse to start.
		port2, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		second := c.podFromTemplate(t, ns, chart.ds.GetName(), nodeName, func(p *corev1.Pod) {
			ctn := &p.Spec.Containers[0]
			for i, a := range ctn.Args {
				ctn.Args[i] = strings.ReplaceAll(a, fmt.Sprintf(":%d", port), fmt.Sprintf(":%d", port2))
			}
			for i := range ctn.Ports {
				if ctn.Ports[i].ContainerPort == int32(port) {
					ctn.Ports[i].ContainerPort = int32(port2)
				}
			}
		})
		plugins = append(plugins, second)
		exit := c.waitContainerExit(t, second, runningTimeout)
		if exit.ExitCode == 0 || !strings.Contains(exit.Message+c.containerLogText(second), "refusing to start") {
			t.Errorf("a second node plugin: exit %d, %q; want a refusal to start", exit.ExitCode, exit.Message)
		}
		c.deletePod(t, second, goneTimeout)
		forget(second)
		if n := registrations() - before; n != 0 {
			t.Errorf("a second node plugin on the node made the kubelet register %s %d more times", driverName, n)
		}
		c.step("a second node plugin refused to start, never registered", t2)

		app2, vol2 := app("chart")
		done(app1, vol1) // published by kustomize's driver, unpublished by the chart's

		uninstall(chart, h1)
		survives(app2, vol2, "chart", "no node plugin")
		k2 := install(kust)
		survives(app2, vol2, "chart", "after the move back to kustomize")
		done(app2, vol2) // published by the chart's driver, unpublished by kustomize's

		uninstall(kust, k2)

		if recs, err := boltRecords(filepath.Join(stateRoot, driverName, "state.db")); err != nil || len(recs) > 0 {
			t.Errorf("state of the deployed driver after both pods: records %v (%v), want none", recs, err)
		}
	})
}

// installFromRelease builds a release of make image's index (test/manifests'
// cmd/release, the same that make release runs, with the kubectl plugin for
// linux/amd64), imports its OCI archive into the node's containerd with the
// command docs/operations.md gives for containerd 1.6 and 2.x, checks that
// containerd has the index under both names the archive gives it (REPO:VERSION,
// and REPO@DIGEST, the name the kubelet's REPO:VERSION@DIGEST is looked up by)
// and every blob of the archive (the three platforms' images and their SBOM
// artifacts), and returns the release's Linux manifests
// (manifests/ephemera-scratch-linux.yaml) for this node, the image left as the
// release names it.
func (c *cluster) installFromRelease(t *testing.T, dir, stateRoot string, port int, img shippedImage) deployment {
	t.Helper()
	t0 := time.Now()
	ctx := context.Background()
	plugin := filepath.Join(c.root, "bin", "kubectl-ephemera")
	if err := c.goBuildIn(ctx, c.repoRoot, plugin, "./drivers/scratch/cmd/kubectl-ephemera"); err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = c.repoRoot
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	const version = "v0.0.0-e2e"
	out := filepath.Join(dir, "release")
	cmd := exec.Command("go", "run", "./cmd/release", "-version", version, "-image-layout", img.layout,
		"-release-url", "https://example.com/e2e", "-revision", git("rev-parse", "HEAD"), "-source-date-epoch", git("log", "-1", "--format=%ct"),
		"-plugin", "linux/amd64="+plugin, "-out", out)
	cmd.Dir = filepath.Join(c.repoRoot, "test", "manifests")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cmd/release: %v\n%s", err, b)
	}
	c.step("release of make image's index built", t0)

	t1 := time.Now()
	repo := "localhost/ephemera-scratch"
	names := []string{repo + ":" + version, repo + "@" + img.digest}
	images := func() map[string]string { // name to target digest
		ls, err := c.node.ctr(ctx, "images", "ls")
		if err != nil {
			t.Fatalf("ctr images ls: %v\n%s", err, ls)
		}
		m := map[string]string{}
		for _, l := range strings.Split(ls, "\n")[1:] {
			if f := strings.Fields(l); len(f) > 2 {
				m[f[0]] = f[2]
			}
		}
		return m
	}
	for _, n := range names {
		if d, ok := images()[n]; ok {
			t.Fatalf("containerd has %s (%s) before the import", n, d)
		}
	}
	archive := filepath.Join(out, "ephemera-scratch-"+version+".oci.tar")
	t.Cleanup(func() { _, _ = c.node.ctr(context.Background(), append([]string{"images", "rm"}, names...)...) })
	if b, err := c.node.ctr(ctx, "images", "import", "--all-platforms", archive); err != nil {
		t.Fatalf("ctr images import --all-platforms %s: %v\n%s", archive, err, b)
	}
	got := images()
	for _, n := range names {
		if got[n] != img.digest {
			t.Fatalf("ctr images ls after the import: %s is %q, want make image's index %s (images: %v)", n, got[n], img.digest, got)
		}
	}
	blobs, err := archiveBlobs(archive)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := c.node.ctr(ctx, "content", "ls", "-q")
	if err != nil {
		t.Fatalf("ctr content ls: %v\n%s", err, cl)
	}
	have := strings.Fields(cl)
	for _, b := range blobs {
		if !slices.Contains(have, b) {
			t.Fatalf("containerd's content store lacks the archive's blob %s after ctr images import --all-platforms", b)
		}
	}
	c.step(fmt.Sprintf("release archive imported into containerd (%d blobs: 3 platforms, 3 SBOMs)", len(blobs)), t1)

	objs, err := readObjects(filepath.Join(out, "manifests", "ephemera-scratch-linux.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dep := deployment{name: "release"}
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			dep.ds = o
		}
		dep.objs = append(dep.objs, o)
	}
	if dep.ds == nil {
		t.Fatal("the release's Linux manifests have no DaemonSet")
	}
	want := names[0] + "@" + img.digest
	if got := driverImage(dep.ds); got != want {
		t.Fatalf("the release's DaemonSet runs %q, want %s", got, want)
	}
	if pp, _, _ := unstructured.NestedString(driverContainer(dep.ds), "imagePullPolicy"); pp != string(corev1.PullIfNotPresent) {
		t.Fatalf("the release's driver container has imagePullPolicy %q, want IfNotPresent", pp)
	}
	if err := c.forThisNode(dep.ds, stateRoot, "", port); err != nil {
		t.Fatal(err)
	}
	return dep
}

// archiveBlobs returns the digests of an OCI layout archive's blobs.
func archiveBlobs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ds []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return ds, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if hexd, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && h.Typeflag == tar.TypeReg {
			ds = append(ds, "sha256:"+hexd)
		}
	}
}

// wantNoPull checks that the kubelet started every container of a running pod
// from the node's image store ("already present on machine") and never pulled.
func (c *cluster) wantNoPull(t *testing.T, p *corev1.Pod) {
	t.Helper()
	c.waitEvent(t, p, regexp.MustCompile(`already present on machine`), 30*time.Second)
	evs, err := c.cs.CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": p.Name}.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == "Pulling" || e.Reason == "Failed" || e.Reason == "BackOff" {
			t.Errorf("%s: the kubelet tried to pull: %s %s", p.Name, e.Reason, e.Message)
		}
	}
}

// renderDeployment renders a target of test/manifests (with values for a Helm
// target) into dir and returns its objects and its node-plugin DaemonSet.
func (c *cluster) renderDeployment(t *testing.T, dir, target string, values map[string]any) deployment {
	t.Helper()
	args := []string{"-out", dir, "-target", target}
	if values != nil {
		vb, err := json.Marshal(values)
		if err != nil {
			t.Fatal(err)
		}
		vf := filepath.Join(dir, target+"-values.yaml")
		if err := os.WriteFile(vf, vb, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-values", vf)
	}
	if b, err := c.render(args...).CombinedOutput(); err != nil {
		t.Fatalf("render %s: %v\n%s", target, err, b)
	}
	objs, err := readObjects(filepath.Join(dir, target+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dep := deployment{name: target}
	for _, o := range objs {
		// The harness's namespace-scoped test pod of the chart (helm test) is not
		// part of an install.
		if o.GetKind() == "Pod" {
			continue
		}
		if o.GetKind() == "DaemonSet" {
			if dep.ds != nil {
				t.Fatalf("%s: two DaemonSets", target)
			}
			dep.ds = o
		}
		dep.objs = append(dep.objs, o)
	}
	if dep.ds == nil {
		t.Fatalf("%s: no DaemonSet among %d objects", target, len(objs))
	}
	return dep
}

// driverContainer is a DaemonSet's container named driver.
func driverContainer(ds *unstructured.Unstructured) map[string]any {
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	for _, ci := range cs {
		if ctn, ok := ci.(map[string]any); ok && ctn["name"] == "driver" {
			return ctn
		}
	}
	return nil
}

// memoryPlanLogged checks a DaemonSet's driver log for Go's soft memory limit:
// set from its container's memory limit L (containerLimit="L"), less the
// content capacity the driver holds (at most its --content-capacity C):
// limit= between framework.GoMemoryLimit(L-C) and GoMemoryLimit(L).
func memoryPlanLogged(ds *unstructured.Unstructured, log string) error {
	ctn := driverContainer(ds)
	l, _, _ := unstructured.NestedString(ctn, "resources", "limits", "memory")
	q, err := resource.ParseQuantity(l)
	if err != nil {
		return fmt.Errorf("the driver container's memory limit %q: %w", l, err)
	}
	capacity := int64(0)
	args, _, _ := unstructured.NestedStringSlice(ctn, "args")
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--content-capacity="); ok {
			c, err := resource.ParseQuantity(v)
			if err != nil {
				return fmt.Errorf("%s: %w", a, err)
			}
			capacity = c.Value()
		}
	}
	re := regexp.MustCompile(`"Set Go's soft memory limit from the container's[^"]*".* limit="([^"]+)" containerLimit="([^"]+)"`)
	m := re.FindStringSubmatch(log)
	if m == nil {
		return fmt.Errorf("the driver's log does not say it set Go's memory limit")
	}
	got, err1 := resource.ParseQuantity(m[1])
	ctnLimit, err2 := resource.ParseQuantity(m[2])
	if err1 != nil || err2 != nil || ctnLimit.Value() != q.Value() {
		return fmt.Errorf("the driver set Go's memory limit to %s from a container limit of %s, want the container's %s", m[1], m[2], l)
	}
	if lo, hi := framework.GoMemoryLimit(q.Value()-capacity), framework.GoMemoryLimit(q.Value()); got.Value() < lo || got.Value() > hi {
		return fmt.Errorf("the driver set Go's memory limit to %s, want between %d and %d bytes (container %s, --content-capacity %d bytes)", m[1], lo, hi, l, capacity)
	}
	return nil
}

// driverImage is the image of a DaemonSet's driver container.
func driverImage(ds *unstructured.Unstructured) string {
	s, _ := driverContainer(ds)["image"].(string)
	return s
}

// driverArg is the driver container's argument with prefix, "" if none.
func driverArg(ds *unstructured.Unstructured, prefix string) string {
	args, _ := driverContainer(ds)["args"].([]any)
	for _, a := range args {
		if s, ok := a.(string); ok && strings.HasPrefix(s, prefix) {
			return s
		}
	}
	return ""
}

// regWatch samples a kubelet registration directory for one driver's sockets.
type regWatch struct {
	max  atomic.Int32
	done chan struct{}
	wg   sync.WaitGroup
}

// watchRegistrations samples dir every 10 ms and keeps the largest number of
// registration sockets of driver seen at once.
func watchRegistrations(dir, driver string) *regWatch {
	w := &regWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			ents, _ := os.ReadDir(dir)
			n := int32(0)
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), driver) {
					n++
				}
			}
			if n > w.max.Load() {
				w.max.Store(n)
			}
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stop ends the watch and returns the most sockets seen at once.
func (w *regWatch) stop() int {
	close(w.done)
	w.wg.Wait()
	return int(w.max.Load())
}

// waitContainerExit waits until the pod's first container has terminated once
// (now or as its last state before a restart) and returns how.
func (c *cluster) waitContainerExit(t *testing.T, p *corev1.Pod, d time.Duration) corev1.ContainerStateTerminated {
	t.Helper()
	var term corev1.ContainerStateTerminated
	c.waitPod(t, p, d, 200*time.Millisecond, "pod "+p.Name+"'s container exited", func(cur *corev1.Pod) (bool, error) {
		for _, s := range cur.Status.ContainerStatuses {
			for _, st := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
				if st != nil {
					term = *st
					return true, nil
				}
			}
		}
		return false, nil
	})
	return term
}

// containerLogText is the log of the pod's containers on the node (all of it).
func (c *cluster) containerLogText(p *corev1.Pod) string {
	var b strings.Builder
	for _, f := range podLogFiles(c.podLogsDir, p) {
		if data, err := os.ReadFile(f); err == nil {
			b.Write(data)
		}
	}
	return b.String()
}

// podLogFiles are the log files of the pod's containers in a kubelet's pod logs
// directory.
func podLogFiles(podLogsDir string, p *corev1.Pod) []string {
	files, _ := filepath.Glob(filepath.Join(podLogsDir, p.Namespace+"_"+p.Name+"_"+string(p.UID), "*", "*.log"))
	return files
}

// undeploy deletes a release's applied objects (in reverse order; those
// deleted already are skipped) but the CSIDriver, restores the harness's
// CSIDriver, and stops the registration watcher w of regDir: two registration
// sockets of the driver at once fail the test.
func (c *cluster) undeploy(t *testing.T, a *applier, applied []*unstructured.Unstructured, w *regWatch, regDir string) {
	t.Helper()
	ctx := context.Background()
	for i := len(applied) - 1; i >= 0; i-- {
		if applied[i].GetKind() == "CSIDriver" {
			continue // the harness's, restored below
		}
		if err := a.delete(ctx, applied[i]); err != nil {
			t.Errorf("delete %s: %v", describe(applied[i]), err)
		}
	}
	if err := c.applyCSIDriver(ctx); err != nil {
		t.Errorf("restore the harness's CSIDriver: %v", err)
	}
	if max := w.stop(); max > 1 {
		t.Errorf("%d registration sockets of %s at once in %s: two node plugins registered", max, driverName, regDir)
	}
}
