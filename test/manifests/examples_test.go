package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// csiDriverDefaults are the API server's defaults of CSIDriver spec fields an
// example's csidriver.yaml may leave out.
var csiDriverDefaults = map[string]any{
	"requiresRepublish": false, "seLinuxMount": false, "storageCapacity": false, "serviceAccountTokenInSecrets": false,
}

// TestExamples: every example driver deploys with the chart (and hello with its
// kustomize overlay): the rendered CSIDriver is the example's csidriver.yaml, the
// driver container runs the example's image with flags its main.go defines
// (framework.BindFlags', klog's and its own) ending in exactly the values' args,
// the admission policy is about the example's driver, and the example's pod.yaml
// uses that driver.
func TestExamples(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	common := flagNames(t, filepath.Join(root, "framework", "flags.go"), regexp.MustCompile(`fs\.\w*Var\([^"\n]*"([a-z0-9-]+)"`))
	if len(common) < 10 {
		t.Fatalf("framework/flags.go: found only the flags %v", common)
	}
	n := 0
	for _, r := range renderAll(t) {
		if !r.example() {
			continue
		}
		n++
		t.Run(r.Name, func(t *testing.T) {
			dir := filepath.Join(root, r.Example)
			var vals struct {
				Driver struct {
					Name string   `json:"name"`
					Args []string `json:"args"`
				} `json:"driver"`
				Image struct {
					Repository string `json:"repository"`
					Tag        string `json:"tag"`
				} `json:"image"`
				Admission struct {
					NamespaceLabel struct{ Key, Value string } `json:"namespaceLabel"`
				} `json:"admission"`
			}
			readYAML(t, filepath.Join(dir, ExampleValuesFile), &vals)

			// The CSIDriver: csidriver.yaml's name and spec (API defaults for
			// fields it leaves out).
			var want Object
			readYAML(t, filepath.Join(dir, "csidriver.yaml"), &want)
			ds := r.find("CSIDriver")
			if len(ds) != 1 {
				t.Fatalf("%d CSIDrivers, want 1", len(ds))
			}
			got := ds[0]
			if got.Name() != want.Name() || vals.Driver.Name != want.Name() {
				t.Errorf("CSIDriver %q, values driver.name %q, csidriver.yaml %q: want one name", got.Name(), vals.Driver.Name, want.Name())
			}
			sameCSIDriverSpec(t, got, want)

			// The driver container: the example's image and flags.
			driver := driverContainer(t, r)
			if img := vals.Image.Repository + ":" + vals.Image.Tag; driver.Get("image") != img ||
				!strings.HasSuffix(vals.Image.Repository, "/ephemera-"+filepath.Base(r.Example)) {
				t.Errorf("driver image %v, want the example's image %s (…/ephemera-%s)", driver.Get("image"), img, filepath.Base(r.Example))
			}
			main := filepath.Join(dir, "main.go")
			src, err := os.ReadFile(main)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(src), "framework.BindFlags(flag.CommandLine") {
				t.Fatalf("%s does not call framework.BindFlags: the chart's flags would be unknown", main)
			}
			defined := slices.Concat(common, flagNames(t, main, regexp.MustCompile(`flag\.\w+\("([a-z0-9-]+)"`)))
			if strings.Contains(string(src), "klog.InitFlags(nil)") {
				defined = append(defined, "v")
			}
			args := stringList(driver.Get("args"))
			for _, a := range args {
				if name := strings.TrimPrefix(flagName(a), "--"); !slices.Contains(defined, name) {
					t.Errorf("driver arg %s: %s defines no flag %q (it has %v)", a, r.Example, name, defined)
				}
			}
			if tail := args[max(0, len(args)-len(vals.Driver.Args)):]; !slices.Equal(tail, vals.Driver.Args) {
				t.Errorf("driver args %q do not end in the values' args %q", args, vals.Driver.Args)
			}

			// The admission policy (the chart's): about this driver and label.
			if ps := r.find("ValidatingAdmissionPolicy"); r.Kustomize == "" {
				if len(ps) != 1 {
					t.Fatalf("%d admission policies, want 1", len(ps))
				}
				text := fmt.Sprint(ps[0].Get("spec"))
				label := fmt.Sprintf("namespaceObject.metadata.labels[%q] == %q", vals.Admission.NamespaceLabel.Key, vals.Admission.NamespaceLabel.Value)
				if !strings.Contains(text, fmt.Sprintf("v.csi.driver == %q", want.Name())) || !strings.Contains(text, label) {
					t.Errorf("admission policy is not about %s and %s=%s", want.Name(), vals.Admission.NamespaceLabel.Key, vals.Admission.NamespaceLabel.Value)
				}
			}

			// Nothing is the scratch driver's any more: a path or name left over
			// would share its socket, state or objects.
			for _, o := range r.objs {
				if m := scratchRef.FindString(fmt.Sprint(o)); m != "" {
					t.Errorf("%s %s still mentions the scratch driver: %s", o.Kind(), o.Name(), m)
				}
			}

			// pod.yaml uses the driver inline.
			var pod Object
			readYAML(t, filepath.Join(dir, "pod.yaml"), &pod)
			if d := pod.Get("spec", "volumes", 0, "csi", "driver"); d != want.Name() {
				t.Errorf("pod.yaml uses the CSI driver %v, want %s", d, want.Name())
			}
		})
	}
	if n < 2 {
		t.Errorf("%d example targets rendered, want hello and tokenfile at least", n)
	}
}

// TestExampleHelmTests: `helm test` of an example mounts its driver's volume
// read-only (with the example's attributes) from a pinned image with a shell.
func TestExampleHelmTests(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range Targets() {
		if tg.Example == "" || tg.Kustomize != "" {
			continue
		}
		vals, err := tg.Values(root)
		if err != nil {
			t.Fatal(err)
		}
		b, err := HelmTests(filepath.Join(root, Chart), vals, Namespace)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := Decode(b)
		if err != nil || len(objs) != 1 {
			t.Fatalf("%s: test hooks %d objects (%v), want one Pod", tg.Name, len(objs), err)
		}
		p := objs[0]
		name := vals["driver"].(map[string]any)["name"]
		if p.Get("spec", "volumes", 0, "csi", "driver") != name || p.Get("spec", "volumes", 0, "csi", "readOnly") != true {
			t.Errorf("%s: test volume %v, want %s read-only", tg.Name, p.Get("spec", "volumes", 0), name)
		}
		c := containers(p)[0]
		if ref, _ := c.Get("image").(string); pinned(ref) != "" {
			t.Errorf("%s: test image %q not pinned", tg.Name, ref)
		}
		if s := fmt.Sprint(c.Get("command")); strings.Contains(s, "probe") || !strings.Contains(s, "/proc/self/mountinfo") {
			t.Errorf("%s: a read-only test must check the mount and write nothing: %s", tg.Name, s)
		}
	}
}

// scratchRef matches the scratch driver's name, objects, image and namespace label.
var scratchRef = regexp.MustCompile(`scratch\.csi\.ephemera\.dev|ephemera-scratch|scratch-allowed`)

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// flagNames returns the first submatch of re in the file.
func flagNames(t *testing.T, path string, re *regexp.Regexp) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

func mapsUnion(a, b map[string]any) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// sameCSIDriverSpec checks that the rendered CSIDriver got has the spec of
// want (a csidriver.yaml), a field either leaves out standing for the API
// server's default.
func sameCSIDriverSpec(t *testing.T, got, want Object) {
	t.Helper()
	gs, _ := got.Get("spec").(map[string]any)
	ws, _ := want.Get("spec").(map[string]any)
	for k := range mapsUnion(gs, ws) {
		g, ok := gs[k]
		if !ok {
			g = csiDriverDefaults[k]
		}
		w, ok := ws[k]
		if !ok {
			w = csiDriverDefaults[k]
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("CSIDriver spec.%s = %v, csidriver.yaml has %v", k, g, w)
		}
	}
}
