package manifests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestScaffoldDeploys: the deploy files `ephemera new` (cmd/ephemera) writes
// for each kind deploy with the chart: its values.yaml meets the schema and
// renders (the release and its helm test), the rendered CSIDriver is its
// csidriver.yaml, the image is the values' (the plugin's in the sidecar for
// -kind plugin, beside the scratch driver named by driver.name), the admission
// policy is about its driver and label, and its pod.yaml uses the driver.
func TestScaffoldDeploys(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go run ./cmd/ephemera")
	}
	root := mustRoot(t)
	chart := filepath.Join(root, Chart)
	for _, kind := range []string{"content", "loop", "plugin"} {
		t.Run(kind, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "whoami")
			cmd := exec.Command("go", "run", "./cmd/ephemera", "new", "-tidy=false", "-kind", kind, "-sdk", "v0.1.0", "-image", "registry.example.com/whoami", "example.com/whoami", dir)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("ephemera new: %v\n%s", err, out)
			}
			var vals map[string]any
			readYAML(t, filepath.Join(dir, "deploy", "values.yaml"), &vals)
			if err := ValidateValues(chart, vals); err != nil {
				t.Fatalf("values.yaml does not meet the chart's schema: %v", err)
			}
			b, err := HelmRelease(chart, "whoami", Namespace, vals)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			r := rendered{Target{Name: "scaffold-" + kind}, objs}
			if _, err := HelmReleaseTests(chart, "whoami", Namespace, vals); err != nil {
				t.Errorf("helm test: %v", err)
			}

			var want Object
			readYAML(t, filepath.Join(dir, "deploy", "csidriver.yaml"), &want)
			ds := r.find("CSIDriver")
			if len(ds) != 1 || ds[0].Name() != "whoami.example.com" || want.Name() != "whoami.example.com" {
				t.Fatalf("CSIDrivers %v, csidriver.yaml %q: want one, whoami.example.com", ds, want.Name())
			}
			sameCSIDriverSpec(t, ds[0], want)

			driver := driverContainer(t, r)
			args := stringList(driver.Get("args"))
			image := driver.Get("image")
			if kind == "plugin" {
				if !slices.Contains(args, "--driver-name=whoami.example.com") || !slices.Contains(args, "--plugin=whoami=unix:///run/ephemera/plugins/whoami/whoami.sock") {
					t.Errorf("the scratch driver's args %q: want --driver-name and --plugin whoami", args)
				}
				image = nil
				for _, c := range r.find("DaemonSet")[0].Get("spec", "template", "spec", "containers").([]any) {
					if c.(map[string]any)["name"] == "plugin-whoami" {
						image = c.(map[string]any)["image"]
					}
				}
			} else if strings.Contains(fmt.Sprint(args), "--driver-name") {
				t.Errorf("driver args %q: the scratch driver's", args)
			}
			if image != "registry.example.com/whoami:v0.1.0" {
				t.Errorf("image %v, want the values' registry.example.com/whoami:v0.1.0", image)
			}

			ps := r.find("ValidatingAdmissionPolicy")
			if len(ps) != 1 {
				t.Fatalf("%d admission policies, want 1", len(ps))
			}
			text := fmt.Sprint(ps[0].Get("spec"))
			if !strings.Contains(text, `v.csi.driver == "whoami.example.com"`) || !strings.Contains(text, `namespaceObject.metadata.labels["example.com/whoami-allowed"] == "true"`) {
				t.Errorf("admission policy is not about whoami.example.com and example.com/whoami-allowed=true: %s", text)
			}

			var pod Object
			readYAML(t, filepath.Join(dir, "deploy", "pod.yaml"), &pod)
			if d := pod.Get("spec", "volumes", 0, "csi", "driver"); d != "whoami.example.com" {
				t.Errorf("pod.yaml uses the CSI driver %v", d)
			}
			if _, err := os.Stat(filepath.Join(dir, "go.sum")); err == nil {
				t.Errorf("-tidy=false wrote go.sum")
			}
		})
	}
}
