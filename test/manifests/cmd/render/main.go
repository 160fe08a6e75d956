// Command render writes every deployment target of Ephemera (kustomize overlays,
// the admission policy, `helm template` of the chart with default and
// embedded-registrar values) into -out as <target>.yaml, after `helm lint` of the
// chart; it fails on any lint error or render error.
//
//	go run ./cmd/render -out ../../_output/manifests
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ephemera-csi/ephemera/test/manifests"
)

func main() {
	out := flag.String("out", "", "directory for the rendered manifests (created; required)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "render: -out DIR is required")
		os.Exit(2)
	}
	if err := run(*out); err != nil {
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
	}
	return nil
}
