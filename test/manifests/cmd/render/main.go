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
// or stdout. With -tests it writes the chart's `helm test` hooks instead (the pod
// `helm test RELEASE` runs), to apply after the release's objects. The values are
// checked against the schema first: each schema error is printed once, and nothing
// is linted or rendered.
//
//	go run github.com/ephemera-csi/ephemera/test/manifests/cmd/render@VERSION \
//	  -chart "$(go list -m -f '{{.Dir}}' github.com/ephemera-csi/ephemera)/deploy/helm/ephemera-driver" \
//	  -release whoami -values values.yaml > whoami.yaml
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
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
	tests := flag.Bool("tests", false, "with -chart: render only the chart's `helm test` hooks (the pod `helm test RELEASE` runs), not the release's objects")
	flag.Parse()
	if *tests && *chart == "" {
		fmt.Fprintln(os.Stderr, "render: -tests needs -chart")
		os.Exit(2)
	}
	if *chart != "" {
		if *target != "" || *release == "" {
			fmt.Fprintln(os.Stderr, "render: -chart takes -release NAME (and -values FILE ...), not -target")
			os.Exit(2)
		}
		c := chartRender{dir: *chart, release: *release, namespace: *namespace, valueFiles: valueFiles, tests: *tests}
		if err := c.run(*out, os.Stdout, os.Stderr); err != nil {
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

// chartRender is one -chart run: the chart in dir as release in namespace, with
// the values files (later over earlier); tests: its `helm test` hooks only.
type chartRender struct {
	dir, release, namespace string
	valueFiles              []string
	tests                   bool
}

// run checks the values against the chart's schema (each error once), lints the
// chart with them, and renders it into out ("" or "-": stdout). Diagnostics go
// to stderr; the returned error does not repeat them.
func (c chartRender) run(out string, stdout, stderr io.Writer) error {
	vals := map[string]any{}
	for _, f := range c.valueFiles {
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
	// The schema first, alone: helm lint reports a schema error twice (as
	// values.yaml's and as the templates'), and its joined error a third and
	// fourth time.
	if err := manifests.ValidateValues(c.dir, vals); err != nil {
		return fmt.Errorf("the values (%s) do not meet %s:\n%w", c.files(), filepath.Join(c.dir, "values.schema.json"), err)
	}
	if err := lint(c.dir, vals, "", stderr); err != nil {
		return err
	}
	render := manifests.HelmRelease
	if c.tests {
		render = manifests.HelmReleaseTests
	}
	b, err := render(c.dir, c.release, c.namespace, vals)
	if err != nil {
		return err
	}
	objs, err := manifests.Decode(b)
	if err != nil {
		return err
	}
	if len(objs) == 0 && c.tests {
		return errors.New("the chart renders no `helm test` hook with these values (helmTest.enabled is false?)")
	}
	if out == "" || out == "-" {
		_, err = stdout.Write(b)
		return err
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return err
	}
	what := "objects"
	if c.tests {
		what = "helm test hooks"
	}
	fmt.Fprintf(stderr, "%s: %d %s (%s)\n", out, len(objs), what, c.files())
	return nil
}

func (c chartRender) files() string {
	if len(c.valueFiles) == 0 {
		return "the chart's defaults"
	}
	return strings.Join(c.valueFiles, ", ")
}

// lint is helm lint of chart with vals: it prints each message once to stderr
// (prefixed with "(name)" when name is set) and fails when one is an error,
// without repeating them.
func lint(chart string, vals map[string]any, name string, stderr io.Writer) error {
	msgs, err := manifests.Lint(chart, vals)
	prefix := "helm lint"
	if name != "" {
		prefix += " (" + name + ")"
	}
	for _, m := range msgs {
		fmt.Fprintf(stderr, "%s: %s\n", prefix, strings.TrimSpace(m))
	}
	if err != nil {
		return fmt.Errorf("%s of %s failed: the errors above", prefix, chart)
	}
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
		if err := lint(chart, vals, t.Name, os.Stderr); err != nil {
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
