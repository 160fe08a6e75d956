// Command render writes every deployment target of Ephemera (kustomize overlays,
// the admission policy, `helm template` of the chart with default and
// embedded-registrar values) into -out as <target>.yaml, after `helm lint` of the
// chart; it fails on any lint error or render error.
//
//	go run ./cmd/render -out ../../_output/manifests
//
// With -target it renders that one target only, with the values of -values over
// the target's own (validated against values.schema.json, not linted): the e2e
// tests render an example for their node (its kubelet root, ports) this way.
//
//	go run ./cmd/render -out DIR -target helm-example-hello -values e2e-values.yaml
//
// With -chart it is `helm template` of that chart directory, for a driver author
// without helm, from anywhere (no checkout needed: docs/authors.md, "Without helm"):
// the values files over the chart's defaults (validated against its
// values.schema.json), the chart linted with them, the objects written to -out FILE
// or stdout.
//
//	go run github.com/ephemera-csi/ephemera/test/manifests/cmd/render@VERSION \
//	  -chart "$(go list -m -f '{{.Dir}}' github.com/ephemera-csi/ephemera)/deploy/helm/ephemera-driver" \
//	  -release whoami -values values.yaml > whoami.yaml
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"

	"github.com/ephemera-csi/ephemera/test/manifests"
)

func main() {
	out := flag.String("out", "", "directory for the rendered manifests (created; required)")
	target := flag.String("target", "", "render only this target (a name of manifests.Targets) into -out/<target>.yaml")
	var valueFiles []string
	flag.Func("values", "with -target (a Helm target): a YAML file of chart values over the target's; with -chart: a values file over the chart's defaults (repeatable, later files win)", func(v string) error {
		valueFiles = append(valueFiles, v)
		return nil
	})
	chart := flag.String("chart", "", "render this chart directory (helm template) instead of the repository's targets")
	release := flag.String("release", "", "with -chart: the release name (what `helm install NAME` would take; required)")
	namespace := flag.String("namespace", manifests.Namespace, "with -chart: the release namespace")
	flag.Parse()
	if *chart != "" {
		if *target != "" || *release == "" {
			fmt.Fprintln(os.Stderr, "render: -chart takes -release NAME (and -values FILE ...), not -target")
			os.Exit(2)
		}
		if err := runChart(*chart, *release, *namespace, valueFiles, *out); err != nil {
			fmt.Fprintln(os.Stderr, "render:", err)
			os.Exit(1)
		}
		return
	}
	if len(valueFiles) > 1 {
		fmt.Fprintln(os.Stderr, "render: one -values file with -target")
		os.Exit(2)
	}
	values := new(string)
	if len(valueFiles) == 1 {
		*values = valueFiles[0]
	}
	if *out == "" {
		fmt.Fprintln(os.Stderr, "render: -out DIR is required")
		os.Exit(2)
	}
	if *values != "" && *target == "" {
		fmt.Fprintln(os.Stderr, "render: -values needs -target")
		os.Exit(2)
	}
	var err error
	if *target != "" {
		err = runOne(*out, *target, *values)
	} else {
		err = run(*out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

// runChart renders chartDir as release in ns with the values files (later over
// earlier), after helm lint with the same values, into out ("" or "-": stdout).
func runChart(chartDir, release, ns string, valueFiles []string, out string) error {
	vals := map[string]any{}
	for _, f := range valueFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		v := map[string]any{}
		if err := yaml.Unmarshal(b, &v); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		vals = chartutil.CoalesceTables(v, vals)
	}
	msgs, err := manifests.Lint(chartDir, vals)
	for _, m := range msgs {
		fmt.Fprintf(os.Stderr, "helm lint: %s\n", m)
	}
	if err != nil {
		return err
	}
	b, err := manifests.HelmRelease(chartDir, release, ns, vals)
	if err != nil {
		return err
	}
	objs, err := manifests.Decode(b)
	if err != nil {
		return err
	}
	if out == "" || out == "-" {
		_, err = os.Stdout.Write(b)
		return err
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s: %d objects (%s)\n", out, len(objs), strings.Join(valueFiles, ", "))
	return nil
}

func run(out string) error {
	root, err := manifests.RepoRoot()
	if err != nil {
		return err
	}
	chart := filepath.Join(root, manifests.Chart)
	for _, t := range manifests.Targets() {
		if t.Kustomize != "" {
			continue
		}
		vals, err := t.Values(root)
		if err != nil {
			return err
		}
		msgs, err := manifests.Lint(chart, vals)
		for _, m := range msgs {
			fmt.Fprintf(os.Stderr, "helm lint (%s): %s\n", t.Name, m)
		}
		if err != nil {
			return err
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, t := range manifests.Targets() {
		if err := write(root, out, t); err != nil {
			return err
		}
	}
	return nil
}

// write renders t into out/<name>.yaml, checking that it decodes.
func write(root, out string, t manifests.Target) error {
	b, err := manifests.Render(root, t)
	if err != nil {
		return err
	}
	objs, err := manifests.Decode(b)
	if err != nil {
		return fmt.Errorf("%s: %w", t.Name, err)
	}
	p := filepath.Join(out, t.Name+".yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return err
	}
	fmt.Printf("%s: %d objects\n", p, len(objs))
	return nil
}

// runOne renders the target named name with the values of the file values (if
// any) over the target's own.
func runOne(out, name, values string) error {
	root, err := manifests.RepoRoot()
	if err != nil {
		return err
	}
	var t manifests.Target
	for _, x := range manifests.Targets() {
		if x.Name == name {
			t = x
		}
	}
	if t.Name == "" {
		return fmt.Errorf("no target %q", name)
	}
	if values != "" {
		if t.Kustomize != "" {
			return fmt.Errorf("target %s is a kustomize target: -values applies to Helm targets", name)
		}
		b, err := os.ReadFile(values)
		if err != nil {
			return err
		}
		extra := map[string]any{}
		if err := yaml.Unmarshal(b, &extra); err != nil {
			return fmt.Errorf("%s: %w", values, err)
		}
		own := maps.Clone(t.HelmValues)
		if own == nil {
			own = map[string]any{}
		}
		t.HelmValues = chartutil.CoalesceTables(extra, own)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return write(root, out, t)
}
