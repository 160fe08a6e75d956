// Command chart-readme writes the Helm chart's README.md, generated from its
// Chart.yaml, values.yaml (every value with the comment above it) and
// values.schema.json (types); -check only reports whether the file is current.
//
//	go run ./cmd/chart-readme          # make chart-readme
//	go run ./cmd/chart-readme -check
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ephemera-csi/ephemera/test/manifests"
)

func main() {
	check := flag.Bool("check", false, "exit 1 if the README is not current, write nothing")
	flag.Parse()
	if err := run(*check); err != nil {
		fmt.Fprintln(os.Stderr, "chart-readme:", err)
		os.Exit(1)
	}
}

func run(check bool) error {
	root, err := manifests.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, manifests.Chart)
	want, err := manifests.ChartReadme(dir)
	if err != nil {
		return err
	}
	p := filepath.Join(dir, manifests.ChartReadmeFile)
	if check {
		got, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("%s is not current: run make chart-readme", p)
		}
		return nil
	}
	if err := os.WriteFile(p, want, 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", p)
	return nil
}
