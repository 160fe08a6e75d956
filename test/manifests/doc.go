// Package manifests renders Ephemera's deployment manifests (every kustomize
// overlay under deploy/ and the Helm chart deploy/helm/ephemera-driver) in Go, with
// the libraries kubectl and helm use (sigs.k8s.io/kustomize/api/krusty,
// helm.sh/helm/v3), lints the chart, and tests invariants on the rendered objects.
//
// It is its own Go module so that kustomize's and Helm's dependency graphs stay out
// of the project's go.mod.
//
//	go test ./...                       # invariants
//	go run ./cmd/render -out DIR        # one YAML file per target, plus helm lint
//	go run ./cmd/chart-readme           # the chart's README.md from values.yaml (make chart-readme)
//
// The rendered files are what test/e2e/deploy_test.go dry-runs against a real
// kube-apiserver (make manifests renders them into _output/manifests).
package manifests
