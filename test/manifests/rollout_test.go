package manifests

import (
	"path/filepath"
	"testing"
)

// TestRolloutValue: the chart's rollout.maxUnavailable reaches both node
// DaemonSets as the API server reads it (a percentage stays a string, a number
// an int); maxSurge stays 0 whatever is set. (The defaults, 10%, are checked on
// every rendered target by TestDaemonSet.) The e2e has no controller-manager:
// what the DaemonSet controller does with the value is the API's documented
// behaviour (a percentage of the DaemonSet's nodes, rounded up), not tested here.
func TestRolloutValue(t *testing.T) {
	root := mustRoot(t)
	for name, c := range map[string]struct {
		value any
		want  any
	}{
		"percentage": {"25%", "25%"},
		"one node":   {1, float64(1)},
		"all":        {"100%", "100%"},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := Helm(filepath.Join(root, Chart), map[string]any{
				"rollout": map[string]any{"maxUnavailable": c.value},
				"windows": map[string]any{"enabled": true},
			}, Namespace)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			dss := rendered{Target{Name: name}, objs}.find("DaemonSet")
			if len(dss) != 2 {
				t.Fatalf("%d DaemonSets, want the Linux and the Windows one", len(dss))
			}
			for _, ds := range dss {
				checkStrategy(t, ds, c.want)
			}
		})
	}
	for name, v := range map[string]any{
		"zero":             0,
		"zero percent":     "0%",
		"over 100 percent": "101%",
		"a number string":  "1",
		"a fraction":       1.5,
		"maxSurge":         map[string]any{"maxSurge": 1},
	} {
		vals := map[string]any{"rollout": map[string]any{"maxUnavailable": v}}
		if m, ok := v.(map[string]any); ok {
			vals = map[string]any{"rollout": m}
		}
		if _, err := Helm(filepath.Join(root, Chart), vals, Namespace); err == nil {
			t.Errorf("rollout %s (%v): rendered, want a schema error", name, v)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestRolloutPatch: the kustomize patch that deploy/base/daemonset.yaml and
// docs/operations.md ("Upgrade") document changes maxUnavailable of an
// overlay's DaemonSet and nothing else of its strategy.
func TestRolloutPatch(t *testing.T) {
	root := mustRoot(t)
	dir := t.TempDir()
	// kustomize takes a directory resource only by a relative path.
	overlay, err := filepath.Rel(dir, filepath.Join(root, "deploy/overlays/linux"))
	if err != nil {
		t.Fatal(err)
	}
	kust := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ` + overlay + `
patches:
- target: {kind: DaemonSet, name: ephemera-scratch-node}
  patch: |-
    - {op: replace, path: /spec/updateStrategy/rollingUpdate/maxUnavailable, value: 1}
`
	objs := kustomizeText(t, dir, kust)
	checkStrategy(t, rendered{Target{Name: "patched"}, objs}.driverDaemonSet(t), float64(1))
}
