//go:build e2e && linux

package e2e

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ephemera-csi/ephemera/framework/stamp"
	"github.com/ephemera-csi/ephemera/test/internal/sysloop"
)

// upgradeNS holds TestDriverUpgradeRollback's app pods.
const upgradeNS = "e2e-upgrade"

// upgradeApps is the Deployment whose pods hold the volumes across the rolls.
const upgradeApps = "upgrade-apps"

// The app pods' volumes: one per backend the shipped manifests serve (dir
// added to their --backends), and a readOnly one; the pod has an fsGroup.
var upgradeVolumes = []struct {
	name     string
	attrs    map[string]string
	readOnly bool
	fsType   string // at the target on the node
}{
	{"tmpfs", map[string]string{"size": "16Mi"}, false, "tmpfs"},
	{"loop", map[string]string{"backend": "loop", "size": "64Mi", "fsType": "ext4"}, false, "ext4"},
	{"dir", map[string]string{"backend": "dir"}, false, ""},
	{"ro", map[string]string{"size": "8Mi"}, true, "tmpfs"},
}

// TestDriverUpgradeRollback upgrades the node plugin from the release of
// test/e2e/upgrade-from (the last commit whose state encoding differs from
// this tree's) to this tree's, and rolls it back, as an operator does: the
// shipped manifests (deploy/overlays/linux-embedded-registrar, each release's
// own, rendered by its own test/manifests) applied with the release's image,
// the release's index imported into the node's containerd (importRelease),
// the DaemonSet controller replacing the node plugin's pod under the
// manifests' RollingUpdate (maxUnavailable 10%, maxSurge 0), while pods of a
// Deployment keep inline volumes of every backend (tmpfs, loop ext4, dir, a
// readOnly tmpfs; fsGroup) mounted and written. After each roll:
//
//   - every volume the other version published is still the same mount
//     (/proc/self/mountinfo: mount ID, source, options), was never unmounted
//     nor mounted twice during the roll (sampled every 20 ms), and its pod
//     reads what it wrote and writes again;
//   - the driver counts them from its records (ephemera_volumes by backend)
//     and rebuilt none from the node (ephemera_reconcile_total adopted and
//     quarantined 0, no state recovery): the records the other version wrote
//     are read;
//   - a new pod publishes, and a pod the other version published is deleted
//     and unpublished cleanly (no mount, target, loop device left).
//
// At the end the Deployment and the DaemonSet are deleted: no mount, loop
// device, volume directory or record is left. A watcher samples the kubelet's
// registration directory: never two registration sockets of the driver.
func TestDriverUpgradeRollback(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("runs the shipped image: EPHEMERA_E2E_RUNTIME=containerd")
	}
	drv := requireDriver(t)
	ctx := context.Background()
	tAll := time.Now()

	from := upgradeFromImage(t)
	cur := currentImage(t)
	t.Logf("upgrade from %s (commit %s, index %s) to %s (index %s)", from.version, from.commit, from.img.digest, cur.version, cur.img.digest)
	t0 := time.Now()
	fromRef := c.importRelease(t, from)
	curRef := c.importRelease(t, cur)
	c.step("both releases' indexes imported into containerd", t0)

	stateRoot := c.exampleStateDir(t, "upgrade")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	oldDep := c.releaseDeployment(t, "from "+from.version, from, stateRoot, fromRef, port)
	newDep := c.releaseDeployment(t, "current "+cur.version, cur, stateRoot, curRef, port)
	ns, dsName := oldDep.ds.GetNamespace(), oldDep.ds.GetName()
	if newDep.ds.GetNamespace() != ns || newDep.ds.GetName() != dsName {
		t.Fatalf("the releases' DaemonSets differ: %s/%s and %s/%s", ns, dsName, newDep.ds.GetNamespace(), newDep.ds.GetName())
	}
	for _, n := range []string{ns, upgradeNS} {
		if err := c.ensureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	stateDir := strings.TrimPrefix(driverArg(newDep.ds, "--state-dir="), "--state-dir=")
	if old := strings.TrimPrefix(driverArg(oldDep.ds, "--state-dir="), "--state-dir="); old != stateDir || !strings.HasPrefix(stateDir, stateRoot+"/") {
		t.Fatalf("state directories: from %q, current %q; want one below %s", old, stateDir, stateRoot)
	}

	a := c.newApplier(t)
	regDir := filepath.Join(c.kubeletRoot, "plugins_registry")
	var applied []*unstructured.Unstructured
	drv.withDriverStopped(t, func() {
		w := watchRegistrations(regDir, driverName)
		plugin := false // a node plugin of the releases may run
		defer func() {
			// The apps first, while a node plugin unpublishes them; then the
			// DaemonSet (the controller would make a deleted pod again).
			c.deleteUpgradeApps(t, plugin)
			c.deleteDaemonSet(t, ns, dsName, goneTimeout)
			c.undeploy(t, a, applied, w, regDir)
		}()

		t1 := time.Now()
		before := c.registrations()
		for _, o := range oldDep.objs {
			if err := a.apply(ctx, o, false); err != nil {
				t.Fatalf("apply %s: %v", describe(o), err)
			}
			applied = append(applied, o)
		}
		plugin = true
		p := c.waitNodePlugin(t, c.daemonSetPod(t, ns, dsName, nodeName), from, before)
		c.step("release "+from.version+" installed: node plugin Running, Ready, registered", t1)

		// Pods of a Deployment with a volume of each backend, published by the
		// release we upgrade from.
		t2 := time.Now()
		apps := newUpgradeApps(c)
		apps.create(t, 2)
		apps.wantVolumes(t, "installed", from, port)
		c.step("2 app pods Running, their 8 volumes published by "+from.version, t2)

		// Upgrade.
		p = apps.roll(t, a, newDep, p, cur)
		apps.wantVolumes(t, "upgraded", cur, port)
		// A new pod publishes; a pod the old release published unpublishes.
		apps.scale(t, 3)
		apps.wantVolumes(t, "scaled", cur, port)
		apps.deleteOne(t, from.version)
		apps.wantVolumes(t, "replaced", cur, port)

		// Rollback: the older release adopts what the newer one published.
		p = apps.roll(t, a, oldDep, p, from)
		apps.wantVolumes(t, "rolled back", from, port)
		apps.deleteOne(t, cur.version)
		apps.wantVolumes(t, "replaced again", from, port)

		// Everything goes.
		t3 := time.Now()
		c.deleteUpgradeApps(t, true)
		apps.wantAllCleanedUp(t)
		c.deleteDaemonSet(t, ns, dsName, goneTimeout)
		c.waitPodGone(t, p, goneTimeout)
		plugin = false
		state := filepath.Join(stateDir, "state.db")
		if recs, err := boltRecords(state); err != nil || len(recs) > 0 {
			t.Errorf("%s after every pod went: records %v (%v), want none", state, recs, err)
		}
		if ds := sysloop.Below(stateRoot); len(ds) > 0 {
			t.Errorf("loop devices left: %+v", ds)
		}
		if ms := mountsUnder(stateRoot); len(ms) > 0 {
			t.Errorf("mounts left below %s: %+v", stateRoot, ms)
		}
		for _, sub := range []string{"volumes", "loop"} {
			if ents, err := os.ReadDir(filepath.Join(stateDir, sub)); err == nil && len(ents) > 0 {
				var names []string
				for _, e := range ents {
					// The store's identity, which a backend keeps in its root.
					if e.Name() != stamp.FileName {
						names = append(names, e.Name())
					}
				}
				if len(names) > 0 {
					t.Errorf("left in %s: %v", filepath.Join(stateDir, sub), names)
				}
			}
		}
		c.step("apps and DaemonSet deleted: no mount, loop device, directory or record left", t3)
	})
	c.step("TestDriverUpgradeRollback (of it from the import of both releases on: "+time.Since(t0).Round(100*time.Millisecond).String()+")", tAll)
}

// importRelease imports a release's index into the node's containerd as an
// operator without a registry does (docs/operations.md, "Installing a
// release": ctr -n k8s.io images import --all-platforms), as
// ephemera.local/e2e/upgrade:<version> and tagged with its digest, and returns the reference a DaemonSet names it by, <name>:<version>@<digest>
// (IfNotPresent: the kubelet finds it on the node and never pulls). Not through
// the e2e registry: an index the kubelet pulled once is no longer a preloaded
// image to it (KubeletEnsureSecretPulledImages), and the working tree's index
// is the one TestShippedImageMigration later starts from its release archive
// without a pull.
func (c *cluster) importRelease(t *testing.T, rel driverRelease) string {
	t.Helper()
	ctx := context.Background()
	const base = "ephemera.local/e2e/upgrade"
	archive := filepath.Join(c.root, "upgrade-"+rel.version+".oci.tar")
	if err := tarDir(rel.img.layout, archive); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(archive)
	names := []string{base + ":" + rel.version, base + "@" + rel.img.digest}
	t.Cleanup(func() { _, _ = c.node.ctr(context.Background(), append([]string{"images", "rm"}, names...)...) })
	if out, err := c.node.ctr(ctx, "images", "import", "--all-platforms", "--base-name", base, archive); err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", archive, err, out)
	}
	// The name the kubelet's <name>:<tag>@<digest> is looked up by (the
	// release archive of make release carries it; this layout names only the
	// version).
	if out, err := c.node.ctr(ctx, "images", "tag", "--force", names[0], names[1]); err != nil {
		t.Fatalf("ctr images tag %s %s: %v\n%s", names[0], names[1], err, out)
	}
	ls, err := c.node.ctr(ctx, "images", "ls", "-q")
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, ls)
	}
	for _, n := range names {
		if !slices.Contains(strings.Fields(ls), n) {
			t.Fatalf("containerd lacks %s after the import of %s's index:\n%s", n, rel.version, ls)
		}
	}
	return names[0] + "@" + rel.img.digest
}

// tarDir writes the files below dir into a tar archive at out, named relative
// to dir (an OCI layout directory becomes an OCI archive).
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: info.Size(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// releaseDeployment reads a release's rendered manifests and makes them fit
// this node as forThisNode does (the kubelet root, the state root, the metrics
// port, the image as importRelease named it) and lets pods choose the dir
// backend too (--backends=tmpfs,loop,dir: the manifests serve tmpfs and loop).
func (c *cluster) releaseDeployment(t *testing.T, name string, rel driverRelease, stateRoot, image string, port int) deployment {
	t.Helper()
	objs, err := readObjects(rel.manifests)
	if err != nil {
		t.Fatal(err)
	}
	dep := deployment{name: name}
	for _, o := range objs {
		switch o.GetKind() {
		case "Pod":
			continue
		case "DaemonSet":
			dep.ds = o
		}
		dep.objs = append(dep.objs, o)
	}
	if dep.ds == nil {
		t.Fatalf("%s: no DaemonSet in %s", name, rel.manifests)
	}
	if err := c.forThisNode(dep.ds, stateRoot, image, port); err != nil {
		t.Fatal(err)
	}
	// driverContainer reads a copy (NestedSlice): change the object's own.
	containers, _, _ := unstructured.NestedSlice(dep.ds.Object, "spec", "template", "spec", "containers")
	found := false
	for _, ci := range containers {
		ctn, _ := ci.(map[string]any)
		if ctn["name"] != "driver" {
			continue
		}
		args, _ := ctn["args"].([]any)
		for i, a := range args {
			if s, _ := a.(string); strings.HasPrefix(s, "--backends=") {
				args[i] = s + ",dir"
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("%s: the driver has no --backends flag", name)
	}
	if err := unstructured.SetNestedSlice(dep.ds.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
	if got := driverArg(dep.ds, "--backends="); !strings.HasSuffix(got, ",dir") {
		t.Fatalf("%s: %s after adding dir", name, got)
	}
	strategy, _, _ := unstructured.NestedMap(dep.ds.Object, "spec", "updateStrategy")
	if ty, _ := strategy["type"].(string); ty != string(appsv1.RollingUpdateDaemonSetStrategyType) {
		t.Fatalf("%s: the DaemonSet's update strategy is %q, want RollingUpdate", name, ty)
	}
	ru, _ := strategy["rollingUpdate"].(map[string]any)
	if fmt.Sprint(ru["maxUnavailable"]) != "10%" || fmt.Sprint(ru["maxSurge"]) != "0" {
		t.Fatalf("%s: rollingUpdate %v, want maxUnavailable 10%% and maxSurge 0 (the scenario's premise)", name, ru)
	}
	return dep
}

// registrations counts the kubelet's registrations of the driver so far.
func (c *cluster) registrations() int {
	return countInFile(c.kubelet.logPath, "Register new plugin with name: "+driverName+" ")
}

// waitNodePlugin waits until the node plugin pod p runs rel's image, is Ready,
// and the kubelet has registered the driver once more than before.
func (c *cluster) waitNodePlugin(t *testing.T, p *corev1.Pod, rel driverRelease, before int) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p = c.waitRunning(t, p, runningTimeout)
	if got := p.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(got, rel.img.digest) {
		t.Errorf("the node plugin runs image %q, want %s's %s", got, rel.version, rel.img.digest)
	}
	c.wantNoPull(t, p)
	err := waitFor(ctx, 60*time.Second, 100*time.Millisecond, "kubelet registered "+driverName, func() (bool, error) {
		if c.registrations() <= before {
			return false, nil
		}
		return csiNodeLists(ctx, c, driverName)
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s\nlog:\n%s", err, c.podEvents(p), c.containerLogText(p))
	}
	c.waitPodReady(t, p, 30*time.Second)
	if n := c.registrations() - before; n != 1 {
		t.Errorf("the kubelet registered %s %d times for one node plugin", driverName, n)
	}
	return p
}

// rollNodePlugin applies dep's objects (a release's manifests) over the
// installed ones and lets the DaemonSet controller replace the node plugin pod
// from by one of the new template, as its RollingUpdate strategy says; it
// returns the new pod once it runs rel's image, is Ready and registered, and
// the DaemonSet reports every pod updated and available. Nothing else deletes
// from.
func (c *cluster) rollNodePlugin(t *testing.T, a *applier, dep deployment, from *corev1.Pod, rel driverRelease) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	t0 := time.Now()
	before := c.registrations()
	for _, o := range dep.objs {
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("%s: apply %s: %v", dep.name, describe(o), err)
		}
	}
	c.waitPodGone(t, from, goneTimeout)
	gone := time.Now()
	ns, name := dep.ds.GetNamespace(), dep.ds.GetName()
	p := c.waitNodePlugin(t, c.daemonSetPod(t, ns, name, nodeName), rel, before)
	if p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == from.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] {
		t.Errorf("the new node plugin has the old pod's %s %q", appsv1.DefaultDaemonSetUniqueLabelKey, p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey])
	}
	err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "DaemonSet "+name+" rolled out", func() (bool, error) {
		d, err := c.cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.DesiredNumberScheduled != 1 || s.UpdatedNumberScheduled != 1 || s.NumberAvailable != 1 {
			return false, fmt.Errorf("status %+v, generation %d", s, d.Generation)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.step(fmt.Sprintf("node plugin rolled to %s by the DaemonSet controller (old pod gone after %v, the new one registered %v later)",
		rel.version, gone.Sub(t0).Round(100*time.Millisecond), time.Since(gone).Round(100*time.Millisecond)), t0)
	return p
}

// upgradeVol is an app pod's volume as the test saw it published.
type upgradeVol struct {
	vol    corev1.Volume
	target string
	mount  mountInfo // the mount at the target when first seen
}

// upgradePod is an app pod, what it wrote and which release published it.
type upgradePod struct {
	pod     *corev1.Pod
	by      string // the release that published its volumes
	content string // what each writable volume's file holds
	vols    []upgradeVol
}

// upgradeAppsRig is the Deployment of app pods and what the test knows of them.
type upgradeAppsRig struct {
	c    *cluster
	pods []*upgradePod
	gone []*upgradePod // deleted pods, whose volumes must stay cleaned up
}

func newUpgradeApps(c *cluster) *upgradeAppsRig { return &upgradeAppsRig{c: c} }

// create makes the Deployment with n replicas and waits for its pods.
func (r *upgradeAppsRig) create(t *testing.T, n int32) {
	t.Helper()
	c := r.c
	var writes [][]string
	for _, v := range upgradeVolumes {
		if !v.readOnly {
			writes = append(writes, st("append", "/v/"+v.name+"/by", "start"))
		}
	}
	tmpl := c.newPod(upgradeNS, "", csiVolume("unused", nil), steps(append(writes, st("pause"))...))
	tmpl.Spec.NodeName = "" // kube-scheduler binds it
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyAlways
	tmpl.Spec.Volumes = nil
	tmpl.Spec.Containers[0].VolumeMounts = nil
	for _, v := range upgradeVolumes {
		vol := csiVolume(v.name, v.attrs)
		if v.readOnly {
			vol.CSI.ReadOnly = ptrTo(true)
		}
		tmpl.Spec.Volumes = append(tmpl.Spec.Volumes, vol)
		tmpl.Spec.Containers[0].VolumeMounts = append(tmpl.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: v.name, MountPath: "/v/" + v.name, ReadOnly: v.readOnly})
	}
	tmpl.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptrTo(int64(3000))}
	labels := map[string]string{"app": upgradeApps}
	tmpl.Labels = labels
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: upgradeNS, Name: upgradeApps},
		Spec: appsv1.DeploymentSpec{
			Replicas: &n,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec},
		},
	}
	if _, err := c.cs.AppsV1().Deployments(upgradeNS).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitPods(t, int(n), "")
}

// scale sets the Deployment's replicas to n and waits for the new pods.
func (r *upgradeAppsRig) scale(t *testing.T, n int32) {
	t.Helper()
	t0 := time.Now()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
	if _, err := r.c.cs.AppsV1().Deployments(upgradeNS).Patch(context.Background(), upgradeApps, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitPods(t, int(n), "")
	r.c.step(fmt.Sprintf("Deployment scaled to %d: the new pod's volumes published", n), t0)
}

// waitPods waits until the Deployment has n Running pods and records the new
// ones; by is the release they are published by ("" for the running one, set
// by wantVolumes).
func (r *upgradeAppsRig) waitPods(t *testing.T, n int, by string) {
	t.Helper()
	c := r.c
	ctx := context.Background()
	var running []corev1.Pod
	err := waitFor(ctx, runningTimeout, 200*time.Millisecond, fmt.Sprintf("%d Running pods of %s", n, upgradeApps), func() (bool, error) {
		list, err := c.cs.CoreV1().Pods(upgradeNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + upgradeApps})
		if err != nil {
			return false, err
		}
		running = running[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				running = append(running, p)
			}
		}
		if len(running) == n {
			return true, nil
		}
		return false, fmt.Errorf("%d of %d pods Running", len(running), len(list.Items))
	})
	if err != nil {
		list, _ := c.cs.CoreV1().Pods(upgradeNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + upgradeApps})
		var b strings.Builder
		for i := range list.Items {
			p := &list.Items[i]
			fmt.Fprintf(&b, "%s (%s, node %q):\n%s\n", p.Name, p.Status.Phase, p.Spec.NodeName, c.podEvents(p))
		}
		t.Fatalf("%v\n%s", err, b.String())
	}
	for i := range running {
		p := &running[i]
		if slices.ContainsFunc(r.pods, func(u *upgradePod) bool { return u.pod.UID == p.UID }) {
			continue
		}
		wantStep(t, c.output(t, p, 3), 2, "append ok")
		u := &upgradePod{pod: p, by: by, content: "start\n"}
		for _, v := range upgradeVolumes {
			uv := upgradeVol{target: ""}
			for _, vol := range p.Spec.Volumes {
				if vol.Name == v.name {
					uv.vol = vol
				}
			}
			uv.target = c.hostVolumePath(p, uv.vol)
			ms := mountsAt(uv.target)
			if len(ms) != 1 {
				t.Fatalf("%s: %d mounts at %s, want 1: %+v", p.Name, len(ms), uv.target, ms)
			}
			uv.mount = ms[0]
			if v.fsType != "" && uv.mount.FSType != v.fsType {
				t.Errorf("%s: volume %s is %s, want %s", p.Name, v.name, uv.mount.FSType, v.fsType)
			}
			// A readOnly volume is read-only in the container (wantVolumes);
			// the node's mountinfo does not say so here: the driver makes it
			// read-only by a bind remount in its container's mount namespace,
			// and a remount's flags do not propagate to the host's.
			u.vols = append(u.vols, uv)
		}
		r.pods = append(r.pods, u)
	}
}

// targets lists the targets of the live pods' volumes.
func (r *upgradeAppsRig) targets() []string {
	var out []string
	for _, u := range r.pods {
		for _, v := range u.vols {
			out = append(out, v.target)
		}
	}
	return out
}

// roll rolls the node plugin to rel while a watcher samples every live
// volume's mounts; none may be unmounted or mounted twice meanwhile.
func (r *upgradeAppsRig) roll(t *testing.T, a *applier, dep deployment, from *corev1.Pod, rel driverRelease) *corev1.Pod {
	t.Helper()
	w := watchMounts(r.targets())
	p := r.c.rollNodePlugin(t, a, dep, from, rel)
	lo, hi, samples := w.stop()
	for _, target := range r.targets() {
		if lo[target] != 1 || hi[target] != 1 {
			t.Errorf("during the roll to %s: between %d and %d mounts at %s (%d samples), want exactly 1 throughout", rel.version, lo[target], hi[target], target, samples)
		}
	}
	t.Logf("roll to %s: every one of %d volumes mounted exactly once in each of %d samples of mountinfo", rel.version, len(r.targets()), samples)
	return p
}

// wantVolumes checks the live pods' volumes with rel's driver serving them:
// each still the mount first seen at its target, and its pod reads what it
// wrote and writes the phase; rel's driver reports them by backend from its
// records and rebuilt none from the node. Pods not yet attributed were
// published by rel.
func (r *upgradeAppsRig) wantVolumes(t *testing.T, phase string, rel driverRelease, port int) {
	t.Helper()
	c := r.c
	t0 := time.Now()
	want := map[string]float64{}
	word := strings.ReplaceAll(phase, " ", "-")
	for _, u := range r.pods {
		if u.by == "" {
			u.by = rel.version
		}
		var writes, reads [][]string
		for i, v := range upgradeVolumes {
			uv := u.vols[i]
			backend := v.attrs["backend"]
			if backend == "" {
				backend = "tmpfs"
			}
			want[backend]++
			ms := mountsAt(uv.target)
			if len(ms) != 1 {
				t.Errorf("%s: %s's volume %s: %d mounts at %s, want 1: %+v", phase, u.pod.Name, v.name, len(ms), uv.target, ms)
				continue
			}
			if m := ms[0]; m.ID != uv.mount.ID || m.Source != uv.mount.Source || m.Options != uv.mount.Options || m.SuperOpts != uv.mount.SuperOpts || m.Dev != uv.mount.Dev {
				t.Errorf("%s: %s's volume %s changed: %+v, first seen as %+v", phase, u.pod.Name, v.name, m, uv.mount)
			}
			if !v.readOnly {
				writes = append(writes, st("append", "/v/"+v.name+"/by", word))
				reads = append(reads, st("read", "/v/"+v.name+"/by"))
			} else {
				reads = append(reads, st("write", "/v/"+v.name+"/x", "1"))
			}
		}
		out := c.exec(t, u.pod, steps(append(writes, reads...)...)...)
		u.content += word + "\n"
		for i := range writes {
			wantStep(t, out, i, "append ok")
		}
		for i := range reads {
			if reads[i][0] == "read" {
				wantStep(t, out, len(writes)+i, "read ok", fmt.Sprintf("content=%q", u.content))
			} else {
				wantStep(t, out, len(writes)+i, "write err EROFS")
			}
		}
	}
	// The driver's view: its records, by backend.
	ctx := context.Background()
	var s scrape
	err := waitFor(ctx, 15*time.Second, 200*time.Millisecond, "the node plugin's metrics", func() (bool, error) {
		var err error
		s, err = scrapeAt(ctx, fmt.Sprintf("127.0.0.1:%d", port))
		return err == nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if v := s.sum("ephemera_build_info", map[string]string{"version": rel.version}); v != 1 {
		t.Errorf("%s: ephemera_build_info{version=%q} = %v: the node plugin is not %s", phase, rel.version, v, rel.version)
	}
	for backend, n := range want {
		if got := s.sum("ephemera_volumes", map[string]string{"backend": backend}); got != n {
			t.Errorf("%s: ephemera_volumes{backend=%q} = %v, want %v", phase, backend, got, n)
		}
	}
	for _, result := range []string{"adopted", "quarantined", "failed"} {
		if got := s.sum("ephemera_reconcile_total", map[string]string{"result": result}); got != 0 {
			t.Errorf("%s: ephemera_reconcile_total{result=%q} = %v: %s did not read every record", phase, result, got, rel.version)
		}
	}
	if got := s.sum("ephemera_state_recoveries_total", nil); got != 0 {
		t.Errorf("%s: ephemera_state_recoveries_total = %v: %s moved the state file aside", phase, got, rel.version)
	}
	{
		ls := sysloop.Where(func(string) bool { return true })
		n, mine := 0, 0
		for _, u := range r.pods {
			for _, v := range u.vols {
				if v.vol.Name != "loop" {
					continue
				}
				n++
				if slices.ContainsFunc(ls, func(d sysloop.Device) bool { return d.Path == v.mount.Source }) {
					mine++
				}
			}
		}
		if mine != n {
			t.Errorf("%s: %d loop devices back the %d loop volumes", phase, mine, n)
		}
	}
	var by []string
	for _, u := range r.pods {
		by = append(by, u.pod.Name+" by "+u.by)
	}
	c.step(fmt.Sprintf("%s: %d pods (%s) read and write their volumes under %s, which counts %v from its records", phase, len(r.pods), strings.Join(by, ", "), rel.version, want), t0)
}

// deleteOne deletes the first live pod published by release by, waits until its
// volumes are unpublished and gone from the node, and for the Deployment's
// replacement.
func (r *upgradeAppsRig) deleteOne(t *testing.T, by string) {
	t.Helper()
	t0 := time.Now()
	i := slices.IndexFunc(r.pods, func(u *upgradePod) bool { return u.by == by })
	if i < 0 {
		t.Fatalf("no live pod published by %s", by)
	}
	u := r.pods[i]
	r.c.deletePod(t, u.pod, goneTimeout)
	r.pods = slices.Delete(r.pods, i, i+1)
	r.gone = append(r.gone, u)
	r.wantCleanedUp(t, u)
	r.waitPods(t, len(r.pods)+1, "")
	r.c.step("a pod published by "+by+" deleted: unpublished, nothing left; its replacement Running", t0)
}

// wantCleanedUp checks that nothing of u's volumes is left on the node.
func (r *upgradeAppsRig) wantCleanedUp(t *testing.T, u *upgradePod) {
	t.Helper()
	for _, v := range u.vols {
		r.c.cleanedUp(t, u.pod, v.vol)
		if v.vol.Name == "loop" {
			dev := v.mount.Source
			if ls := sysloop.Where(func(string) bool { return true }); slices.ContainsFunc(ls, func(d sysloop.Device) bool { return d.Path == dev }) {
				t.Errorf("%s's loop device %s still attached after the pod went", u.pod.Name, dev)
			}
		}
	}
}

// wantAllCleanedUp checks every pod the test saw once the Deployment is gone.
func (r *upgradeAppsRig) wantAllCleanedUp(t *testing.T) {
	t.Helper()
	for _, u := range append(r.gone, r.pods...) {
		r.wantCleanedUp(t, u)
	}
	r.gone, r.pods = append(r.gone, r.pods...), nil
}

// deleteUpgradeApps deletes the app Deployment and, if wait (a node plugin
// runs to unpublish), waits until its pods are gone.
func (c *cluster) deleteUpgradeApps(t *testing.T, wait bool) {
	t.Helper()
	ctx := context.Background()
	fg := metav1.DeletePropagationForeground
	err := c.cs.AppsV1().Deployments(upgradeNS).Delete(ctx, upgradeApps, metav1.DeleteOptions{PropagationPolicy: &fg})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Error(err)
		return
	}
	if !wait {
		return
	}
	err = waitFor(ctx, goneTimeout, 200*time.Millisecond, "the pods of "+upgradeApps+" gone", func() (bool, error) {
		list, err := c.cs.CoreV1().Pods(upgradeNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + upgradeApps})
		if err != nil {
			return false, err
		}
		if len(list.Items) == 0 {
			return true, nil
		}
		return false, fmt.Errorf("%d pods left", len(list.Items))
	})
	if err != nil {
		t.Error(err)
	}
}

// mountWatch samples mountinfo for a set of targets.
type mountWatch struct {
	mu      sync.Mutex
	lo, hi  map[string]int
	samples int
	done    chan struct{}
	wg      sync.WaitGroup
}

// watchMounts samples /proc/self/mountinfo every 20 ms and keeps, per target,
// the fewest and the most mounts seen at it.
func watchMounts(targets []string) *mountWatch {
	w := &mountWatch{lo: map[string]int{}, hi: map[string]int{}, done: make(chan struct{})}
	sample := func() {
		all, err := readMountInfo()
		if err != nil {
			return
		}
		n := map[string]int{}
		for _, m := range all {
			n[m.MountPoint]++
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, tg := range targets {
			if lo, ok := w.lo[tg]; !ok || n[tg] < lo {
				w.lo[tg] = n[tg]
			}
			w.hi[tg] = max(w.hi[tg], n[tg])
		}
		w.samples++
	}
	sample()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				sample()
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	return w
}

// stop ends the watch and returns the fewest and most mounts per target and the
// number of samples.
func (w *mountWatch) stop() (lo, hi map[string]int, samples int) {
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lo, w.hi, w.samples
}
