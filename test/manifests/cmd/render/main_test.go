package main

import (
	"bytes"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
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
	c := chartRender{dir: chart, release: target.Release(), namespace: manifests.Namespace, valueFiles: []string{values}}
	if err := c.run(out, io.Discard, io.Discard); err != nil {
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
	if bytes.Contains(got, []byte("helm.sh/hook")) {
		t.Fatal("the release's objects include a helm hook")
	}

	// -tests: the pod `helm test` runs, for the same release and values.
	c.tests = true
	var tests bytes.Buffer
	if err := c.run("-", &tests, io.Discard); err != nil {
		t.Fatal(err)
	}
	pods, err := manifests.Decode(tests.Bytes())
	if err != nil || len(pods) != 1 {
		t.Fatalf("-tests: %d objects, %v:\n%s", len(pods), err, tests.Bytes())
	}
	pod := pods[0]
	if pod.Kind() != "Pod" || pod.Get("metadata", "annotations", "helm.sh/hook") != "test" ||
		pod.Get("metadata", "namespace") != manifests.Namespace || pod.Get("spec", "volumes", 0, "csi", "driver") != "hello.csi.ephemera.dev" {
		t.Fatalf("-tests renders no helm test pod of the example's driver:\n%s", tests.Bytes())
	}
	// Without helmTest.enabled there is nothing to render: an error, not an empty file.
	off := filepath.Join(t.TempDir(), "off.yaml")
	if err := os.WriteFile(off, []byte("helmTest:\n  enabled: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.valueFiles = []string{values, off}
	if err := c.run("-", io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "helmTest.enabled") {
		t.Fatalf("-tests without helmTest.enabled: %v", err)
	}
}

// TestChartSchemaErrorsOnce: a values file the schema refuses fails the render,
// and the output (diagnostics and the error) names each violation once.
func TestChartSchemaErrorsOnce(t *testing.T) {
	root, err := manifests.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("image:\n  digest: sha256:xyz\nmetrics:\n  port: many\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	c := chartRender{dir: filepath.Join(root, manifests.Chart), release: "x", namespace: manifests.Namespace, valueFiles: []string{bad}}
	err = c.run("-", &stdout, &stderr)
	if err == nil {
		t.Fatalf("bad values rendered:\n%s", stdout.Bytes())
	}
	all := stderr.String() + "render: " + err.Error() + "\n"
	for _, v := range []string{"'/image/digest'", "'/metrics/port'"} {
		if n := strings.Count(all, v); n != 1 {
			t.Errorf("%s named %d times, want once:\n%s", v, n, all)
		}
	}
	if !strings.Contains(all, bad) || stdout.Len() != 0 {
		t.Errorf("the error does not name the values file, or something was rendered:\n%s", all)
	}
}

// TestChartRefusalOnce: values the chart's templates refuse (a memory limit under
// the plan) fail the render with the chart's own message printed once: helm's
// lint mode only logs a `fail` ("[INFO] Fail: ..."), and the render then failed
// with the same message again.
func TestChartRefusalOnce(t *testing.T) {
	root, err := manifests.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("resources:\n  limits:\n    memory: 100Mi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// What helm logs through the standard logger lands here, as on a terminal.
	var logged bytes.Buffer
	log.SetOutput(&logged)
	defer log.SetOutput(os.Stderr)
	var stdout, stderr bytes.Buffer
	c := chartRender{dir: filepath.Join(root, manifests.Chart), release: "x", namespace: manifests.Namespace, valueFiles: []string{bad}}
	err = c.run("-", &stdout, &stderr)
	if err == nil {
		t.Fatalf("a limit under the plan rendered:\n%s", stdout.Bytes())
	}
	all := logged.String() + stderr.String() + "render: " + err.Error() + "\n"
	const refusal = "resources.limits.memory 100Mi does not hold the driver's memory plan, 299Mi"
	if n := strings.Count(all, refusal); n != 1 || strings.Contains(all, "[INFO] Fail") || stdout.Len() != 0 {
		t.Errorf("the refusal printed %d times (want once, as an error), or something was rendered:\n%s", n, all)
	}
}
