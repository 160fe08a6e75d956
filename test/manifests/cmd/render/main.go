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
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"

	"github.com/ephemera-csi/ephemera/test/manifests"
)

func main() {
	out := flag.String("out", "", "directory for the rendered manifests (created; required)")
	target := flag.String("target", "", "render only this target (a name of manifests.Targets) into -out/<target>.yaml")
	values := flag.String("values", "", "with -target, a Helm target: a YAML file of chart values over the target's")
	flag.Parse()
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
