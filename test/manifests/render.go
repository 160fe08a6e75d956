package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Chart is the Helm chart's directory, relative to the repository root.
const Chart = "deploy/helm/ephemera-driver"

// Namespace is where the chart is rendered (the kustomize base uses the same).
const Namespace = "kube-system"

// Target is one rendered set of manifests.
type Target struct {
	// Name is the output file name without ".yaml".
	Name string
	// Kustomize is a kustomization directory relative to the repository root;
	// empty for a Helm target.
	Kustomize string
	// HelmValues are values for the chart (a Helm target when Kustomize is "").
	HelmValues map[string]any
	// Example is an example driver's directory (examples/<name>) relative to the
	// repository root: a Helm target renders the chart with its values.yaml (under
	// HelmValues), a kustomize target its overlay; its csidriver.yaml and main.go
	// are what the rendering is checked against.
	Example string
}

// Release is the Helm release name of a target: ephemera-<example> for an
// example (as its values.yaml says to install it), else ephemera-scratch.
func (t Target) Release() string {
	if t.Example != "" {
		return "ephemera-" + filepath.Base(t.Example)
	}
	return "ephemera-scratch"
}

// ExampleValuesFile is the chart's values file of an example driver, in its directory.
const ExampleValuesFile = "values.yaml"

// Values returns the chart's values of a Helm target: the example's values file,
// if any, with HelmValues over it.
func (t Target) Values(root string) (map[string]any, error) {
	vals := map[string]any{}
	if t.Example != "" {
		b, err := os.ReadFile(filepath.Join(root, t.Example, ExampleValuesFile))
		if err != nil {
			return nil, err
		}
		if err := yaml.Unmarshal(b, &vals); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", t.Example, ExampleValuesFile, err)
		}
	}
	over := maps.Clone(t.HelmValues)
	if over == nil {
		over = map[string]any{}
	}
	return chartutil.CoalesceTables(over, vals), nil
}

// Targets lists everything that is rendered and tested.
func Targets() []Target {
	return []Target{
		{Name: "kustomize-linux", Kustomize: "deploy/overlays/linux"},
		{Name: "kustomize-linux-embedded-registrar", Kustomize: "deploy/overlays/linux-embedded-registrar"},
		{Name: "kustomize-windows-hostprocess", Kustomize: "deploy/overlays/windows-hostprocess"},
		{Name: "kustomize-windows-csi-proxy", Kustomize: "deploy/overlays/windows-csi-proxy"},
		{Name: "kustomize-admission", Kustomize: "deploy/admission"},
		{Name: "helm-default", HelmValues: map[string]any{}},
		{Name: "helm-embedded-registrar", HelmValues: map[string]any{"registrar": map[string]any{"mode": "embedded"}}},
		// The chart's Windows node plugin alone (the Linux one off), in each mode:
		// TestHelmWindowsEqualsOverlays keeps them equal to the kustomize overlays.
		{Name: "helm-windows-hostprocess", HelmValues: map[string]any{"linux": map[string]any{"enabled": false}, "windows": map[string]any{"enabled": true}}},
		{Name: "helm-windows-csi-proxy", HelmValues: map[string]any{"linux": map[string]any{"enabled": false}, "windows": map[string]any{"enabled": true, "mode": "csi-proxy"}}},
		{Name: "kustomize-linux-plugin-sidecar", Kustomize: "deploy/overlays/linux-plugin-sidecar"},
		{Name: "kustomize-plugin-daemonset", Kustomize: "deploy/plugin-daemonset"},
		{Name: "helm-plugins", HelmValues: PluginValues()},
		{Name: "helm-example-hello", Example: "examples/hello"},
		{Name: "helm-example-tokenfile", Example: "examples/tokenfile"},
		{Name: "kustomize-example-hello-embedded-registrar", Kustomize: "examples/hello/deploy", Example: "examples/hello"},
	}
}

// PluginValues are the chart values of the helm-plugins target: the tokenfile
// example in plugin mode as backend "tokens", with the CSIDriver's token
// requests it needs.
func PluginValues() map[string]any {
	return map[string]any{
		"plugins": []any{map[string]any{
			"name":      "tokens",
			"image":     map[string]any{"repository": "ghcr.io/ephemera-csi/ephemera-tokenfile", "tag": "v0.1.0"},
			"args":      []any{"plugin", "--endpoint=$(PLUGIN_ENDPOINT)", "--v=2"},
			"resources": map[string]any{"requests": map[string]any{"cpu": "5m", "memory": "16Mi"}, "limits": map[string]any{"memory": "64Mi"}},
		}},
		"csiDriver": map[string]any{
			"tokenRequests":     []any{map[string]any{"audience": "vault", "expirationSeconds": 3600}},
			"requiresRepublish": true,
		},
	}
}

// RepoRoot walks up from the working directory to the project's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.Contains(b, []byte("module github.com/ephemera-csi/ephemera\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the project's go.mod (module github.com/ephemera-csi/ephemera) is not above the working directory")
		}
		dir = parent
	}
}

// Render renders t as a multi-document YAML stream.
func Render(root string, t Target) ([]byte, error) {
	if t.Kustomize != "" {
		return Kustomize(filepath.Join(root, t.Kustomize))
	}
	vals, err := t.Values(root)
	if err != nil {
		return nil, err
	}
	return helm(filepath.Join(root, Chart), t.Release(), vals, Namespace, false)
}

// Kustomize is `kubectl kustomize dir` (kustomize's default load restrictions).
func Kustomize(dir string) ([]byte, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	return m.AsYaml()
}

// Helm is `helm template ephemera-scratch chartDir --namespace ns --skip-tests`
// with values (validated against values.schema.json): the rendered templates in
// file-name order, NOTES.txt and the `helm test` hooks (templates/tests/) left out.
// That is what `helm install` applies.
func Helm(chartDir string, values map[string]any, ns string) ([]byte, error) {
	return helm(chartDir, "ephemera-scratch", values, ns, false)
}

// HelmRelease is `helm template release chartDir --namespace ns --skip-tests` with
// values (validated against values.schema.json): what `helm install release` would
// apply. The authors' path without helm (cmd/render -chart, docs/authors.md).
func HelmRelease(chartDir, release, ns string, values map[string]any) ([]byte, error) {
	return helm(chartDir, release, values, ns, false)
}

// HelmReleaseTests renders only the chart's `helm test` hooks (templates/tests/)
// of release: what `helm test release` runs, once the release is installed.
func HelmReleaseTests(chartDir, release, ns string, values map[string]any) ([]byte, error) {
	return helm(chartDir, release, values, ns, true)
}

// ValidateValues checks values, over the chart's defaults, against the chart's
// values.schema.json, as helm install does: one error listing every violation.
func ValidateValues(chartDir string, values map[string]any) error {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return fmt.Errorf("load chart %s: %w", chartDir, err)
	}
	vals, err := chartutil.CoalesceValues(ch, values)
	if err != nil {
		return err
	}
	return chartutil.ValidateAgainstSchema(ch, vals)
}

// HelmTests renders only the chart's `helm test` hooks (templates/tests/).
func HelmTests(chartDir string, values map[string]any, ns string) ([]byte, error) {
	return helm(chartDir, "ephemera-scratch", values, ns, true)
}

func helm(chartDir, release string, values map[string]any, ns string, tests bool) ([]byte, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", chartDir, err)
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{
		Name: release, Namespace: ns, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("chart %s values: %w", chartDir, err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", chartDir, err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		isTest := strings.Contains(n, "/templates/tests/")
		if (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) && isTest == tests {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out bytes.Buffer
	for _, n := range names {
		body := strings.TrimSpace(files[n])
		if body == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", n, body)
	}
	return out.Bytes(), nil
}

// Notes renders the chart's NOTES.txt with values.
func Notes(chartDir string, values map[string]any) (string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{
		Name: "ephemera-scratch", Namespace: Namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return "", err
	}
	for n, s := range files {
		if strings.HasSuffix(n, "NOTES.txt") {
			return s, nil
		}
	}
	return "", errors.New("no NOTES.txt")
}

// Lint is `helm lint chartDir` with values; it returns every message and an error
// when one of them is an error (warnings and infos pass). A template's `fail`
// (the chart refusing the values) is an error: helm's engine in lint mode only
// logs it through the standard logger ("[INFO] Fail: ...") and renders on, so
// a refusal would pass the lint and be printed a second time by the render.
func Lint(chartDir string, values map[string]any) ([]string, error) {
	var logged bytes.Buffer
	lintLog.Lock()
	w, flags, prefix := log.Writer(), log.Flags(), log.Prefix()
	log.SetOutput(&logged)
	log.SetFlags(0)
	log.SetPrefix("")
	l := lint.All(chartDir, values, Namespace, false)
	log.SetOutput(w)
	log.SetFlags(flags)
	log.SetPrefix(prefix)
	lintLog.Unlock()
	var msgs []string
	var errs []error
	for line := range strings.Lines(logged.String()) {
		line = strings.TrimSpace(line)
		if refusal, ok := strings.CutPrefix(line, "[INFO] Fail: "); ok {
			err := fmt.Errorf("the chart refuses these values: %s", refusal)
			msgs = append(msgs, "[ERROR] templates: "+err.Error())
			errs = append(errs, err)
		} else if line != "" {
			msgs = append(msgs, line)
		}
	}
	for _, m := range l.Messages {
		msgs = append(msgs, m.Error())
		if m.Severity >= support.ErrorSev {
			errs = append(errs, m.Err)
		}
	}
	if len(errs) > 0 {
		return msgs, fmt.Errorf("helm lint %s: %w", chartDir, errors.Join(errs...))
	}
	return msgs, nil
}

// lintLog serializes Lint's use of the standard logger.
var lintLog sync.Mutex

// Object is one decoded manifest.
type Object map[string]any

// Decode splits a YAML stream into objects (empty documents skipped).
func Decode(stream []byte) ([]Object, error) {
	var objs []Object
	for _, doc := range splitDocs(stream) {
		var o Object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			return nil, fmt.Errorf("decode %q: %w", firstLine(doc), err)
		}
		if len(o) == 0 {
			continue
		}
		objs = append(objs, o)
	}
	return objs, nil
}

func splitDocs(stream []byte) []string {
	var docs []string
	var cur []string
	for _, line := range strings.Split(string(stream), "\n") {
		if strings.TrimRight(line, " \t\r") == "---" {
			docs = append(docs, strings.Join(cur, "\n"))
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return append(docs, strings.Join(cur, "\n"))
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Kind returns the object's kind.
func (o Object) Kind() string { s, _ := o["kind"].(string); return s }

// Name returns metadata.name.
func (o Object) Name() string { s, _ := o.Get("metadata", "name").(string); return s }

// Get walks maps by key and lists by integer index; nil when absent.
func (o Object) Get(path ...any) any {
	var cur any = map[string]any(o)
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := cur.(map[string]any)
			if !ok {
				return nil
			}
			cur = m[k]
		case int:
			l, ok := cur.([]any)
			if !ok || k < 0 || k >= len(l) {
				return nil
			}
			cur = l[k]
		default:
			return nil
		}
	}
	return cur
}

// Name2 returns the "name" field of a list element (container, volume).
func (o Object) Name2() string { s, _ := o["name"].(string); return s }

// podSpec returns the pod spec of a workload or a Pod, nil for other kinds.
func podSpec(o Object) map[string]any {
	var s any
	switch o.Kind() {
	case "Pod":
		s = o.Get("spec")
	case "DaemonSet", "Deployment", "StatefulSet", "Job":
		s = o.Get("spec", "template", "spec")
	}
	m, _ := s.(map[string]any)
	return m
}

// containers returns every container and init container of o's pod spec.
func containers(o Object) []Object {
	spec := podSpec(o)
	var out []Object
	for _, key := range []string{"initContainers", "containers"} {
		l, _ := spec[key].([]any)
		for _, c := range l {
			out = append(out, Object(c.(map[string]any)))
		}
	}
	return out
}
