package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemera-csi/ephemera/test/manifests"
)

// TestChartForAnAuthor: the authors' command (-chart, -release, -values; no checkout
// layout assumed) renders examples/hello's values into the objects the repository's
// own helm-example-hello target renders, which test/manifests checks.
func TestChartForAnAuthor(t *testing.T) {
	root, err := manifests.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var target manifests.Target
	for _, x := range manifests.Targets() {
		if x.Name == "helm-example-hello" {
			target = x
		}
	}
	if target.Name == "" {
		t.Fatal("no target helm-example-hello")
	}
	want, err := manifests.Render(root, target)
	if err != nil {
		t.Fatal(err)
	}
	// The chart copied elsewhere, as an author's module cache holds it.
	chart := filepath.Join(t.TempDir(), "ephemera-driver")
	if err := os.CopyFS(chart, os.DirFS(filepath.Join(root, manifests.Chart))); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "hello.yaml")
	values := filepath.Join(root, target.Example, manifests.ExampleValuesFile)
	if err := runChart(chart, target.Release(), manifests.Namespace, []string{values}, out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("-chart render differs from target %s:\n%s", target.Name, got)
	}
	objs, err := manifests.Decode(got)
	if err != nil || len(objs) < 5 {
		t.Fatalf("%d objects, %v", len(objs), err)
	}
	if !bytes.Contains(got, []byte("hello.csi.ephemera.dev")) {
		t.Fatal("the render does not name the example's driver")
	}
	// A value the schema refuses fails the render, with the file's values.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("image:\n  digest: sha256:xyz\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runChart(chart, "x", manifests.Namespace, []string{values, bad}, filepath.Join(t.TempDir(), "x.yaml")); err == nil {
		t.Fatal("a bad image.digest rendered")
	}
}
