package manifests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelmTestHook: `helm test` runs a pod that uses the driver inline and
// writes into the volume, with the driver's (pinned) image, as nobody.
func TestHelmTestHook(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		vals     map[string]any
		wantSize any
	}{
		"default":   {map[string]any{}, "16Mi"},
		"xfs loop":  {map[string]any{"scratch": map[string]any{"backends": map[string]any{"enabled": []any{"loop"}, "default": "loop"}, "loop": map[string]any{"fsType": "xfs"}}}, "300Mi"},
		"dir":       {map[string]any{"scratch": map[string]any{"backends": map[string]any{"enabled": []any{"dir"}, "default": "dir"}}}, nil},
		"by digest": {map[string]any{"image": map[string]any{"digest": "sha256:" + strings.Repeat("ab", 32)}}, "16Mi"},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := HelmTests(filepath.Join(root, Chart), c.vals, Namespace)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != 1 || objs[0].Kind() != "Pod" {
				t.Fatalf("test hooks: %d objects, want one Pod", len(objs))
			}
			p := objs[0]
			if p.Get("metadata", "annotations", "helm.sh/hook") != "test" {
				t.Errorf("annotations %v, want helm.sh/hook: test", p.Get("metadata", "annotations"))
			}
			if p.Get("metadata", "namespace") != Namespace || p.Get("spec", "restartPolicy") != "Never" {
				t.Errorf("namespace %v, restartPolicy %v", p.Get("metadata", "namespace"), p.Get("spec", "restartPolicy"))
			}
			if p.Get("spec", "volumes", 0, "csi", "driver") != driverName {
				t.Errorf("volume %v does not use %s inline", p.Get("spec", "volumes", 0), driverName)
			}
			if got := p.Get("spec", "volumes", 0, "csi", "volumeAttributes", "size"); got != c.wantSize {
				t.Errorf("size %v, want %v", got, c.wantSize)
			}
			cs := containers(p)
			if len(cs) != 1 {
				t.Fatalf("%d containers", len(cs))
			}
			ref, _ := cs[0].Get("image").(string)
			if why := pinned(ref); why != "" || !strings.HasPrefix(ref, driverImage) {
				t.Errorf("image %q: want the driver's pinned image (%s)", ref, why)
			}
			script := fmt.Sprint(cs[0].Get("command"))
			for _, want := range []string{"/proc/self/mountinfo", ">/volume/probe", "cat /volume/probe"} {
				if !strings.Contains(script, want) {
					t.Errorf("command does not %s: %s", want, script)
				}
			}
			if cs[0].Get("securityContext", "allowPrivilegeEscalation") != false || p.Get("spec", "securityContext", "runAsNonRoot") != true {
				t.Errorf("the test pod must run unprivileged as non-root")
			}
		})
	}
	// Not part of what `helm install` applies (nor of the rendered targets).
	b, err := Helm(filepath.Join(root, Chart), map[string]any{}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "helm.sh/hook") {
		t.Errorf("Helm() renders the test hook")
	}
}

// TestAdmissionReleaseNamespace: the chart's policy lets the release's namespace
// (where the test pod runs) use the driver, unless turned off.
func TestAdmissionReleaseNamespace(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, allow := range []bool{true, false} {
		b, err := Helm(filepath.Join(root, Chart), map[string]any{"admission": map[string]any{"allowReleaseNamespace": allow}}, Namespace)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		p := rendered{Target{}, objs}.find("ValidatingAdmissionPolicy")[0]
		expr := fmt.Sprint(p.Get("spec", "validations", 0, "expression"))
		exempt := `namespaceObject.metadata.name == "` + Namespace + `" ||`
		if strings.Contains(expr, exempt) != allow {
			t.Errorf("allowReleaseNamespace=%v: namespace validation %q", allow, expr)
		}
		if !strings.Contains(expr, `namespaceObject.metadata.labels["ephemera.dev/scratch-allowed"] == "true")`) {
			t.Errorf("allowReleaseNamespace=%v: the label check is gone: %q", allow, expr)
		}
	}
}

// TestHelmLabels: the pod template carries the standard labels, the selector
// stays what it was (immutable on a DaemonSet), and podLabels cannot override it.
func TestHelmLabels(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Helm(filepath.Join(root, Chart), map[string]any{
		"podLabels":      map[string]any{"team": "storage", "app.kubernetes.io/component": "other"},
		"podAnnotations": map[string]any{"example.com/a": "b"},
	}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	ds := rendered{Target{}, objs}.find("DaemonSet")[0]
	if got := fmt.Sprint(ds.Get("spec", "selector", "matchLabels")); got != "map[app.kubernetes.io/component:node app.kubernetes.io/name:ephemera-scratch]" {
		t.Errorf("selector %s changed: a DaemonSet's selector is immutable, upgrades would fail", got)
	}
	labels, _ := ds.Get("spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range map[string]any{
		"app.kubernetes.io/name": "ephemera-scratch", "app.kubernetes.io/instance": "ephemera-scratch",
		"app.kubernetes.io/component": "node", "app.kubernetes.io/managed-by": "Helm", "team": "storage",
	} {
		if labels[k] != v {
			t.Errorf("pod label %s = %v, want %v", k, labels[k], v)
		}
	}
	if labels["app.kubernetes.io/version"] == nil {
		t.Errorf("no app.kubernetes.io/version pod label")
	}
	ann := ds.Get("spec", "template", "metadata", "annotations")
	if fmt.Sprint(ann) != "map[example.com/a:b kubectl.kubernetes.io/default-container:driver]" {
		t.Errorf("pod annotations %v", ann)
	}

	// Overrides name objects and labels; an existing ServiceAccount can be used.
	b, err = Helm(filepath.Join(root, Chart), map[string]any{
		"fullnameOverride": "scratch", "nameOverride": "scratchy",
		"serviceAccount": map[string]any{"create": false, "name": "existing"},
	}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"name: scratch-node\n", "name: scratch-inline\n", "app.kubernetes.io/name: scratchy\n", "serviceAccountName: existing\n", "name: existing\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("overrides: rendered chart lacks %q", want)
		}
	}
	if objs, err = Decode(b); err != nil {
		t.Fatal(err)
	}
	if sas := (rendered{Target{}, objs}).find("ServiceAccount"); len(sas) != 0 {
		t.Errorf("serviceAccount.create=false still renders a ServiceAccount")
	}
}

// TestSchemaRefusesUnknownKeys: every object of values.schema.json closes its
// keys (additionalProperties false, or a schema for maps), so a misspelt value
// fails the install.
func TestSchemaRefusesUnknownKeys(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, Chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, s map[string]any)
	walk = func(path string, s map[string]any) {
		if s["type"] == "object" && path != "/properties/global" {
			if _, ok := s["additionalProperties"]; !ok {
				t.Errorf("schema %s: an object without additionalProperties accepts any key", path)
			}
		}
		for k, v := range s {
			switch v := v.(type) {
			case map[string]any:
				walk(path+"/"+k, v)
			case []any:
				for i, e := range v {
					if m, ok := e.(map[string]any); ok {
						walk(fmt.Sprintf("%s/%s/%d", path, k, i), m)
					}
				}
			}
		}
	}
	walk("", schema)

	for name, vals := range map[string]map[string]any{
		"top level":         {"imagePullSecret": []any{}},
		"image":             {"image": map[string]any{"tags": "v1"}},
		"gc":                {"gc": map[string]any{"intervall": "1m"}},
		"resources":         {"resources": map[string]any{"limit": map[string]any{"memory": "1Gi"}}},
		"registrar":         {"registrar": map[string]any{"resources": map[string]any{"request": map[string]any{}}}},
		"admission label":   {"admission": map[string]any{"namespaceLabel": map[string]any{"key": "a", "value": "b", "values": "c"}}},
		"serviceAccount":    {"serviceAccount": map[string]any{"annotation": map[string]any{}}},
		"tolerations":       {"tolerations": []any{map[string]any{"operator": "Exists", "effects": "NoSchedule"}}},
		"pull secret":       {"imagePullSecrets": []any{"regcred"}},
		"token request":     {"csiDriver": map[string]any{"tokenRequests": []any{map[string]any{"audience": "a", "expiration": 3600}}}},
		"networkPolicy":     {"metrics": map[string]any{"networkPolicy": map[string]any{"enable": false}}},
		"podLabels numbers": {"podLabels": map[string]any{"a": map[string]any{}}},
		"gc duration":       {"gc": map[string]any{"interval": "1 minute"}},
	} {
		if _, err := Helm(filepath.Join(root, Chart), vals, Namespace); err == nil {
			t.Errorf("%s: %v rendered, want a schema error", name, vals)
		}
	}
	// Helm's global values (set when the chart is a subchart) are accepted.
	if _, err := Helm(filepath.Join(root, Chart), map[string]any{"global": map[string]any{"imageRegistry": "x"}}, Namespace); err != nil {
		t.Errorf("global values: %v", err)
	}
}

// TestChartReadmeCurrent: the chart's README.md is what make chart-readme
// generates from values.yaml, values.schema.json and Chart.yaml, so it documents
// every value (the generator fails on a value without a comment or a schema).
func TestChartReadmeCurrent(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, Chart)
	want, err := ChartReadme(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, ChartReadmeFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%s/%s is not current: run make chart-readme", Chart, ChartReadmeFile)
	}
}
