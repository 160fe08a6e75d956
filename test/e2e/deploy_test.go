//go:build e2e && linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// Rendered manifests (see test/manifests): `make manifests` writes them into
// _output/manifests before `make e2e` runs. The test re-renders them itself (go run
// ./cmd/render in test/manifests) when that directory is missing a target or is
// older than a file under deploy/.
const (
	admissionManifest = "kustomize-admission.yaml"
	helmManifest      = "helm-default.yaml"
	fieldManager      = "ephemera-e2e"
	// The admission policy's namespace label (deploy/admission/policy.yaml).
	scratchAllowedLabel = "ephemera.dev/scratch-allowed"
)

var wantManifests = []string{
	"kustomize-linux.yaml", "kustomize-linux-embedded-registrar.yaml", admissionManifest,
	helmManifest, "helm-embedded-registrar.yaml", "kustomize-windows-hostprocess.yaml", "kustomize-windows-csi-proxy.yaml",
	"helm-windows-hostprocess.yaml", "helm-windows-csi-proxy.yaml",
}

// renderedDir caches manifestsDir's answer for the tests of one run.
var renderedDir string

// manifestsDir returns a directory with every rendered target, fresh with respect
// to deploy/.
func (c *cluster) manifestsDir(t *testing.T) string {
	t.Helper()
	if renderedDir != "" {
		return renderedDir
	}
	dir := envOr("EPHEMERA_E2E_MANIFESTS", filepath.Join(c.repoRoot, "_output", "manifests"))
	why := staleManifests(dir, filepath.Join(c.repoRoot, "deploy"))
	if why == "" {
		c.logf("manifests: using %s", dir)
		renderedDir = dir
		return dir
	}
	c.logf("manifests: %s (%s): rendering them with test/manifests", dir, why)
	out := filepath.Join(c.root, "manifests")
	t0 := time.Now()
	if b, err := c.render("-out", out).CombinedOutput(); err != nil {
		t.Fatalf("render manifests: %v\n%s", err, b)
	}
	c.step("render manifests (go run ./cmd/render)", t0)
	renderedDir = out
	return out
}

// staleManifests says why dir cannot be used ("" when it can): a target file is
// missing, or a file under deploy is newer than the oldest target file.
func staleManifests(dir, deployDir string) string {
	var oldest time.Time
	for _, n := range wantManifests {
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			return n + " missing"
		}
		if oldest.IsZero() || st.ModTime().Before(oldest) {
			oldest = st.ModTime()
		}
	}
	var newer string
	_ = filepath.WalkDir(deployDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || newer != "" {
			return nil
		}
		if info, err := d.Info(); err == nil && info.ModTime().After(oldest) {
			newer = p
		}
		return nil
	})
	if newer != "" {
		return newer + " is newer"
	}
	return ""
}

// readObjects decodes a multi-document YAML file.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// applier server-side applies unstructured objects through the dynamic client.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func (c *cluster) newApplier(t *testing.T) *applier {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(c.restCfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.restCfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

func (a *applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = "default"
		}
		return a.dyn.Resource(m.Resource).Namespace(ns), nil
	}
	if o.GetNamespace() != "" {
		return nil, fmt.Errorf("%s %s is cluster-scoped but sets namespace %q", gvk.Kind, o.GetName(), o.GetNamespace())
	}
	return a.dyn.Resource(m.Resource), nil
}

// apply server-side applies o; dryRun=All when dry is set.
func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured, dry bool) error {
	ri, err := a.resource(o)
	if err != nil {
		return err
	}
	b, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: ptrTo(true)}
	if dry {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, b, opts)
	return err
}

func (a *applier) delete(ctx context.Context, o *unstructured.Unstructured) error {
	ri, err := a.resource(o)
	if err != nil {
		return err
	}
	err = ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func ptrTo[T any](v T) *T { return &v }

func describe(o *unstructured.Unstructured) string {
	s := o.GetKind() + " " + o.GetName()
	if ns := o.GetNamespace(); ns != "" {
		s += " -n " + ns
	}
	return s
}

// TestDeployManifestsDryRun sends every object of every rendered target (kustomize
// overlays, admission policy, Helm chart with default and embedded-registrar
// values) to the real kube-apiserver as a server-side apply with dryRun=All: schema,
// defaulting, validation (e.g. DaemonSet rolling update, mount propagation, CEL of
// the admission policy) and admission run, nothing is stored.
func TestDeployManifestsDryRun(t *testing.T) {
	c := clu
	dir := c.manifestsDir(t)
	a := c.newApplier(t)
	ctx := context.Background()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	sort.Strings(files)
	t0 := time.Now()
	total := 0
	for _, f := range files {
		objs, err := readObjects(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) == 0 {
			t.Errorf("%s: no objects", filepath.Base(f))
		}
		for _, o := range objs {
			total++
			if err := a.apply(ctx, o, true); err != nil {
				t.Errorf("%s: %s: dry-run apply refused: %v", filepath.Base(f), describe(o), err)
			}
		}
	}
	c.step(fmt.Sprintf("dry-run apply of %d objects from %d files", total, len(files)), t0)
	if len(files) < len(wantManifests) {
		t.Errorf("%d manifest files in %s, want at least %d", len(files), dir, len(wantManifests))
	}
}

// TestAdmissionPolicy applies the ValidatingAdmissionPolicy and its binding for
// real (deploy/admission, then the Helm chart's rendering of it) and proves what
// they allow: a pod using the driver inline in an unlabelled namespace is refused
// with the policy's message, a labelled namespace is refused a size over the cap,
// an nr_inodes over the cap, 0 or not a number, a backend not allowed,
// csi.storage.k8s.io/ keys and 17 inline volumes of the driver (16, and 16
// with others of another driver, are admitted), and a valid pod is admitted.
// The policy is removed at the end (and its removal awaited), so later tests in
// the default namespace are not affected.
func TestAdmissionPolicy(t *testing.T) {
	c := clu
	dir := c.manifestsDir(t)
	a := c.newApplier(t)
	denied, allowed := "e2e-vap-denied", "e2e-vap-allowed"
	c.admissionNamespaces(t, denied, allowed)

	for _, src := range []string{admissionManifest, helmManifest} {
		t.Run(strings.TrimSuffix(src, ".yaml"), func(t *testing.T) {
			c.checkAdmissionPolicy(t, a, admissionPolicy(t, filepath.Join(dir, src)), denied, allowed)
		})
	}
}

// admissionNamespaces creates the namespaces denied and allowed, the latter
// labelled as the admission policy wants of a namespace that may use the
// scratch driver inline.
func (c *cluster) admissionNamespaces(t *testing.T, denied, allowed string) {
	t.Helper()
	ctx := context.Background()
	for _, ns := range []string{denied, allowed} {
		if err := c.ensureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, scratchAllowedLabel)
	if _, err := c.cs.CoreV1().Namespaces().Patch(ctx, allowed, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// admissionPolicy is the ValidatingAdmissionPolicy and its binding from the
// rendered manifests in file.
func admissionPolicy(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := readObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	var policy []*unstructured.Unstructured
	for _, o := range objs {
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			policy = append(policy, o)
		}
	}
	if len(policy) != 2 {
		t.Fatalf("%s: want a ValidatingAdmissionPolicy and its binding, got %d objects", filepath.Base(file), len(policy))
	}
	return policy
}

func (c *cluster) checkAdmissionPolicy(t *testing.T, a *applier, policy []*unstructured.Unstructured, denied, allowed string) {
	ctx := context.Background()
	t0 := time.Now()
	for _, o := range policy {
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", describe(o), err)
		}
	}
	defer func() {
		for i := len(policy) - 1; i >= 0; i-- {
			if err := a.delete(ctx, policy[i]); err != nil {
				t.Errorf("delete %s: %v", describe(policy[i]), err)
			}
		}
		// The admission plugin drops the policy from its informer shortly after.
		err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "policy removal to take effect", func() (bool, error) {
			return c.dryRunPod(ctx, denied, map[string]string{"size": "1Mi"}) == nil, nil
		})
		if err != nil {
			t.Errorf("%v: later tests would be refused", err)
		}
	}()

	// The policy takes effect when the admission plugin's informer sees it.
	var refusal error
	err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "policy to take effect", func() (bool, error) {
		refusal = c.dryRunPod(ctx, denied, map[string]string{"size": "1Mi"})
		return refusal != nil, nil
	})
	if err != nil {
		t.Fatalf("%v: an inline pod in unlabelled namespace %s is still admitted", err, denied)
	}
	c.step("admission policy in effect", t0)

	// What the refusals say to the pod author.
	wantRefused(t, refusal, "unlabelled namespace", "ValidatingAdmissionPolicy",
		"namespace "+denied+" may not use inline volumes of the CSI driver "+driverName,
		"kubectl label namespace "+denied+" "+scratchAllowedLabel+"=true")
	wantRefused(t, c.dryRunPod(ctx, allowed, map[string]string{"size": "8Gi"}), "size over the cap",
		"volumeAttributes.size", "at most 4Gi")
	wantRefused(t, c.dryRunPod(ctx, allowed, map[string]string{"size": "lots"}), "size not a quantity",
		"volumeAttributes.size", "must be a quantity")
	for name, inodes := range map[string]string{"nr_inodes over the cap": "1048577", "nr_inodes 2^40": "1099511627776",
		"nr_inodes 0 (unlimited)": "0", "nr_inodes not a number": "1k"} {
		wantRefused(t, c.dryRunPod(ctx, allowed, map[string]string{"size": "64Mi", "nr_inodes": inodes}), name,
			"volumeAttributes.nr_inodes", "from 1 to 1048576")
	}
	wantRefused(t, c.dryRunPod(ctx, allowed, map[string]string{"size": "64Mi", "backend": "dir"}), "backend not allowed",
		"volumeAttributes.backend", "tmpfs, loop")
	wantRefused(t, c.dryRunPod(ctx, allowed, map[string]string{"size": "64Mi", "csi.storage.k8s.io/pod.name": "other"}), "reserved key",
		"csi.storage.k8s.io/ prefix")
	// The cap on inline volumes per pod (the driver's --max-volumes-per-pod)
	// counts the volumes of this driver only.
	wantRefused(t, c.dryRunVolumes(ctx, allowed, 17, 0), "17 inline volumes",
		"this pod has 17 inline volumes of the CSI driver "+driverName, "at most 16 are allowed", "fewer volumes")
	for name, n := range map[string][2]int{"16 inline volumes": {16, 0}, "16 inline volumes and 4 of another driver": {16, 4}} {
		if err := c.dryRunVolumes(ctx, allowed, n[0], n[1]); err != nil {
			t.Errorf("pod with %s in labelled namespace refused: %v", name, err)
		}
	}

	// Admitted: valid attributes, no attributes (driver defaults), and pods that do
	// not use the driver at all, wherever they are.
	for name, attrs := range map[string]map[string]string{
		"valid": {"size": "256Mi", "backend": "tmpfs"}, "at the cap": {"size": "4Gi", "backend": "loop"}, "defaults": nil,
		"nr_inodes": {"size": "64Mi", "nr_inodes": "4096"}, "nr_inodes at the cap": {"size": "64Mi", "nr_inodes": "1048576"},
	} {
		if err := c.dryRunPod(ctx, allowed, attrs); err != nil {
			t.Errorf("%s pod in labelled namespace refused: %v", name, err)
		}
	}
	p := c.inlinePod(allowed, map[string]string{"size": "256Mi"})
	p.Name = "vap-admitted"
	if _, err := c.cs.CoreV1().Pods(allowed).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Errorf("valid pod refused: %v", err)
	} else {
		// Not bound to the node: nothing runs it; remove it at once.
		_ = c.cs.CoreV1().Pods(allowed).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))})
	}
	plain := c.inlinePod(denied, nil)
	plain.Spec.Volumes = []corev1.Volume{memoryEmptyDir("data")}
	if _, err := c.cs.CoreV1().Pods(denied).Create(ctx, plain, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("pod without the driver in unlabelled namespace refused: %v", err)
	}
}

// inlinePod is a pod with one inline volume of the driver, not bound to a node
// (admission only; nothing runs it).
func (c *cluster) inlinePod(ns string, attrs map[string]string) *corev1.Pod {
	p := c.newPod(ns, "vap-probe", csiVolume("data", attrs), nil)
	p.Spec.NodeName = ""
	return p
}

// dryRunPod creates an inline-volume pod with dryRun=All: admission runs, nothing is
// stored.
func (c *cluster) dryRunPod(ctx context.Context, ns string, attrs map[string]string) error {
	_, err := c.cs.CoreV1().Pods(ns).Create(ctx, c.inlinePod(ns, attrs), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// dryRunVolumes creates with dryRun=All a pod with ours inline volumes of the
// driver (size 1Mi) and others of another CSI driver.
func (c *cluster) dryRunVolumes(ctx context.Context, ns string, ours, others int) error {
	p := c.inlinePod(ns, map[string]string{"size": "1Mi"})
	for i := 1; i < ours; i++ {
		p.Spec.Volumes = append(p.Spec.Volumes, csiVolume(fmt.Sprintf("data-%d", i), map[string]string{"size": "1Mi"}))
	}
	for i := range others {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: fmt.Sprintf("other-%d", i), VolumeSource: corev1.VolumeSource{
			CSI: &corev1.CSIVolumeSource{Driver: "other.csi.example.com"}}})
	}
	_, err := c.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

func wantRefused(t *testing.T, err error, what string, subs ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: pod admitted, want refused", what)
		return
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		t.Errorf("%s: want Invalid or Forbidden, got %v", what, err)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: refusal lacks %q: %v", what, s, err)
		}
	}
	t.Logf("%s: refused: %v", what, err)
}

// TestAdmissionRealPods: the admission policy from deploy/admission against real
// pods bound to the node, not dry runs: in an unlabelled namespace the pod create
// is refused with the policy's message and nothing is stored; in a labelled
// namespace the size, backend and nr_inodes caps refuse real creates; allowed
// pods (a tmpfs volume with nr_inodes, a loop volume) are stored, run with their
// volume mounted and clean up.
func TestAdmissionRealPods(t *testing.T) {
	c := clu
	requireDriver(t)
	dir := c.manifestsDir(t)
	a := c.newApplier(t)
	ctx := context.Background()
	denied, allowed := "e2e-vapr-denied", "e2e-vapr-allowed"
	c.admissionNamespaces(t, denied, allowed)
	policy := admissionPolicy(t, filepath.Join(dir, admissionManifest))
	c.applyPolicy(t, a, policy, denied)

	// create creates a real pod bound to the node (the kubelet runs what is admitted).
	create := func(ns, name string, attrs map[string]string) (*corev1.Pod, error) {
		p := c.newPod(ns, name, csiVolume("data", attrs), steps(st("write", "/data/f", "4096"), st("pause")))
		return c.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	}
	refused := func(ns, name string, attrs map[string]string, what string, subs ...string) {
		t.Helper()
		p, err := create(ns, name, attrs)
		if err == nil {
			c.deletePod(t, p, goneTimeout)
		}
		wantRefused(t, err, what, subs...)
		if _, err := c.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: refused pod %s/%s: get says %v, want NotFound", what, ns, name, err)
		}
	}
	refused(denied, "vap-unlabelled", map[string]string{"size": "1Mi"}, "unlabelled namespace", "ValidatingAdmissionPolicy",
		"namespace "+denied+" may not use inline volumes of the CSI driver "+driverName,
		"kubectl label namespace "+denied+" "+scratchAllowedLabel+"=true")
	refused(allowed, "vap-too-big", map[string]string{"size": "8Gi"}, "size over the cap", "volumeAttributes.size", "at most 4Gi")
	refused(allowed, "vap-dir", map[string]string{"size": "64Mi", "backend": "dir"}, "backend not allowed", "volumeAttributes.backend", "tmpfs, loop")
	refused(allowed, "vap-inodes", map[string]string{"size": "64Mi", "nr_inodes": "1048577"}, "nr_inodes over the cap",
		"volumeAttributes.nr_inodes", "from 1 to 1048576")

	var pods []*corev1.Pod
	defer func() {
		for _, p := range pods {
			c.deletePod(t, p, 0)
		}
	}()
	for name, attrs := range map[string]map[string]string{
		"vap-tmpfs": {"size": "64Mi", "nr_inodes": "4096"},
		"vap-loop":  {"size": "64Mi", "backend": "loop"},
	} {
		p, err := create(allowed, name, attrs)
		if err != nil {
			t.Errorf("%s refused: %v", name, err)
			continue
		}
		pods = append(pods, p)
	}
	for i, p := range pods {
		pods[i] = c.waitRunning(t, p, runningTimeout)
		m := c.published(t, pods[i], p.Spec.Volumes[0])
		wantStep(t, c.output(t, pods[i], 1), 0, "write ok")
		want := "tmpfs"
		if p.Spec.Volumes[0].CSI.VolumeAttributes["backend"] == "loop" {
			want = "ext4"
		}
		if m.FSType != want {
			t.Errorf("pod %s: volume mounted as %s, want %s", p.Name, m.FSType, want)
		}
	}
	for _, p := range pods {
		c.deletePod(t, p, goneTimeout)
		c.cleanedUp(t, p, p.Spec.Volumes[0])
	}
}

// applyPolicy applies the policy objects, waits until the API server enforces
// them (a pod in the unlabelled namespace denied is refused) and removes them
// when the test ends, waiting until that takes effect.
func (c *cluster) applyPolicy(t *testing.T, a *applier, policy []*unstructured.Unstructured, denied string) {
	t.Helper()
	ctx := context.Background()
	t0 := time.Now()
	for _, o := range policy {
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", describe(o), err)
		}
	}
	t.Cleanup(func() {
		for i := len(policy) - 1; i >= 0; i-- {
			if err := a.delete(ctx, policy[i]); err != nil {
				t.Errorf("delete %s: %v", describe(policy[i]), err)
			}
		}
		err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "policy removal to take effect", func() (bool, error) {
			return c.dryRunPod(ctx, denied, map[string]string{"size": "1Mi"}) == nil, nil
		})
		if err != nil {
			t.Errorf("%v: later tests would be refused", err)
		}
	})
	err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "policy to take effect", func() (bool, error) {
		return c.dryRunPod(ctx, denied, map[string]string{"size": "1Mi"}) != nil, nil
	})
	if err != nil {
		t.Fatalf("%v: an inline pod in unlabelled namespace %s is still admitted", err, denied)
	}
	c.step("admission policy in effect", t0)
}

// render is test/manifests' renderer (go run ./cmd/render) with args. It builds
// with CGO_ENABLED=0 and -trimpath as make manifests does, so that the renderer (Helm and
// kustomize: a large graph) comes from the build cache make test filled instead
// of being compiled again (52 s warm, minutes cold).
func (c *cluster) render(args ...string) *exec.Cmd {
	cmd := exec.Command("go", append([]string{"run", "-trimpath", "./cmd/render"}, args...)...)
	cmd.Dir = filepath.Join(c.repoRoot, "test", "manifests")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}
