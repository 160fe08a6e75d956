package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// helmObjects renders the chart with vals and decodes it.
func helmObjects(t *testing.T, vals map[string]any) rendered {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Helm(filepath.Join(root, Chart), vals, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return rendered{Target{Name: "helm"}, objs}
}

// scratchOnlyFlags are the scratch driver's own flags: the chart passes them only
// while driver.args is null.
var scratchOnlyFlags = []string{"--driver-name", "--backends", "--backend", "--default-size", "--loop-default-size",
	"--loop-fstype", "--loop-preallocate", "--max-volume-size", "--tmpfs-max-inodes", "--capacity", "--events", "--gc-confirm-with-api"}

// flagName returns "--name" of "--name=value".
func flagName(arg string) string { n, _, _ := strings.Cut(arg, "="); return n }

func stringList(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, e := range l {
		out = append(out, fmt.Sprint(e))
	}
	return out
}

// TestHelmAnyDriver: with driver.args set, the chart deploys another driver: the
// common flags, then exactly its args, none of the scratch driver's; its name
// names the objects, the socket and the state; env, mounts, volumes and sidecars
// reach the pod.
func TestHelmAnyDriver(t *testing.T) {
	r := helmObjects(t, map[string]any{
		"driver": map[string]any{
			"name":         "files.example.com",
			"args":         []any{"--allowed-namespaces=a,b", "--plugin-socket=/plugin/plugin.sock"},
			"env":          []any{map[string]any{"name": "PLUGIN_TIMEOUT", "value": "5s"}},
			"volumeMounts": []any{map[string]any{"name": "plugin", "mountPath": "/plugin"}},
		},
		"extraVolumes": []any{map[string]any{"name": "plugin", "emptyDir": map[string]any{}}},
		"sidecars": []any{map[string]any{"name": "plugin", "image": "registry.example.com/plugin:v1",
			"volumeMounts": []any{map[string]any{"name": "plugin", "mountPath": "/plugin"}}}},
		"image":     map[string]any{"repository": "registry.example.com/files", "tag": "v2"},
		"csiDriver": map[string]any{"serviceAccountTokenInSecrets": false, "requiresRepublish": true},
		"registrar": map[string]any{"mode": "embedded"},
		"rbac":      map[string]any{"extraRules": []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "verbs": []any{"get"}}}},
	})
	if rules := fmt.Sprint(r.find("ClusterRole")[0].Get("rules")); !strings.HasSuffix(rules, "map[apiGroups:[] resources:[secrets] verbs:[get]]]") {
		t.Errorf("ClusterRole rules %s lack rbac.extraRules", rules)
	}
	ds := r.find("DaemonSet")[0]
	if ds.Name() != "ephemera-files-node" || fmt.Sprint(ds.Get("spec", "selector", "matchLabels")) != "map[app.kubernetes.io/component:node app.kubernetes.io/name:ephemera-files]" {
		t.Errorf("DaemonSet %s, selector %v: want ephemera-files-node selecting ephemera-files", ds.Name(), ds.Get("spec", "selector", "matchLabels"))
	}
	driver := driverContainer(t, r)
	if driver.Get("image") != "registry.example.com/files:v2" {
		t.Errorf("image %v", driver.Get("image"))
	}
	args := stringList(driver.Get("args"))
	want := []string{
		"--endpoint=unix:///var/lib/kubelet/plugins/files.example.com/csi.sock", "--nodeid=$(NODE_NAME)",
		"--kubelet-root=/var/lib/kubelet", "--state-dir=/var/lib/ephemera/files.example.com",
		"--metrics-address=:9809", "--gc-interval=1m", "--orphan-grace-period=2m", "--register", "--content-bytes-in-flight=48Mi", "--content-capacity=64Mi", "--stats-max-walks=4",
		"--pod-cgroups=auto", "--pod-cgroup-mount=/host/sys/fs/cgroup", "--kubelet-cgroup-root=/", "--kubelet-cgroup-driver=auto", "--memory-limit=$(MEMORY_LIMIT)", "--v=2",
		"--allowed-namespaces=a,b", "--plugin-socket=/plugin/plugin.sock",
	}
	if !slices.Equal(args, want) {
		t.Errorf("args\n %q\nwant\n %q", args, want)
	}
	if fmt.Sprint(driver.Get("env")) != "[map[name:NODE_NAME valueFrom:map[fieldRef:map[fieldPath:spec.nodeName]]] map[name:MEMORY_LIMIT valueFrom:map[resourceFieldRef:map[containerName:driver resource:limits.memory]]] map[name:PLUGIN_TIMEOUT value:5s]]" {
		t.Errorf("env %v", driver.Get("env"))
	}
	if !strings.Contains(fmt.Sprint(driver.Get("volumeMounts")), "map[mountPath:/plugin name:plugin]") {
		t.Errorf("driver volumeMounts lack /plugin: %v", driver.Get("volumeMounts"))
	}
	var names []string
	for _, c := range containers(ds) {
		names = append(names, c.Name2())
	}
	if !slices.Equal(names, []string{"driver", "plugin"}) {
		t.Errorf("containers %v, want driver + the plugin sidecar", names)
	}
	if !strings.Contains(fmt.Sprint(ds.Get("spec", "template", "spec", "volumes")), "map[emptyDir:map[] name:plugin]") {
		t.Errorf("volumes lack the plugin emptyDir")
	}
	d := r.find("CSIDriver")[0]
	if d.Name() != "files.example.com" || d.Get("spec", "serviceAccountTokenInSecrets") != false || d.Get("spec", "requiresRepublish") != true {
		t.Errorf("CSIDriver %s %v", d.Name(), d.Get("spec"))
	}
	// Left out while null (the default); seLinuxMount always (no chart value).
	d = helmObjects(t, map[string]any{}).find("CSIDriver")[0]
	for _, f := range []string{"seLinuxMount", "serviceAccountTokenInSecrets"} {
		if v, ok := d.Get("spec").(map[string]any)[f]; ok {
			t.Errorf("default CSIDriver sets %s: %v", f, v)
		}
	}

	// args: [] is a driver without flags of its own: no scratch flags either.
	r = helmObjects(t, map[string]any{"driver": map[string]any{"name": "files.example.com", "args": []any{}}})
	for _, a := range stringList(driverContainer(t, r).Get("args")) {
		if slices.Contains(scratchOnlyFlags, flagName(a)) {
			t.Errorf("args: [] renders the scratch flag %s", a)
		}
	}

	for name, vals := range map[string]map[string]any{
		"sidecar without image": {"sidecars": []any{map[string]any{"name": "plugin"}}},
		"sidecar typo":          {"sidecars": []any{map[string]any{"name": "plugin", "image": "x:v1", "volumemounts": []any{}}}},
		"volume typo":           {"extraVolumes": []any{map[string]any{"name": "plugin", "emptydir": map[string]any{}}}},
		"mount without path":    {"driver": map[string]any{"volumeMounts": []any{map[string]any{"name": "plugin"}}}},
		"env typo":              {"driver": map[string]any{"env": []any{map[string]any{"name": "A", "valu": "b"}}}},
		// Dropped: no effect on inline volumes (docs/operations.md, "SELinux nodes").
		"seLinuxMount":   {"csiDriver": map[string]any{"seLinuxMount": true}},
		"rbac rule typo": {"rbac": map[string]any{"extraRules": []any{map[string]any{"verbs": []any{"get"}, "resource": []any{"secrets"}}}}},
	} {
		root, _ := RepoRoot()
		if _, err := Helm(filepath.Join(root, Chart), vals, Namespace); err == nil {
			t.Errorf("%s: rendered, want a schema error", name)
		}
	}
}

// TestHelmMonitoring: monitoring.* renders deploy/components/monitoring's objects
// for the chart's DaemonSet: a PodMonitor selecting its pods on the metrics port,
// and the same alerting rules (Prometheus's {{ $labels.x }} left intact).
func TestHelmMonitoring(t *testing.T) {
	if r := helmObjects(t, map[string]any{}); len(r.find("PodMonitor"))+len(r.find("PrometheusRule")) != 0 {
		t.Errorf("monitoring objects rendered by default (they need the Prometheus Operator's CRDs)")
	}
	r := helmObjects(t, map[string]any{"monitoring": map[string]any{
		"podMonitor":     map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}},
		"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}},
	}})
	pms, rules := r.find("PodMonitor"), r.find("PrometheusRule")
	if len(pms) != 1 || len(rules) != 1 {
		t.Fatalf("%d PodMonitors, %d PrometheusRules, want 1 each", len(pms), len(rules))
	}
	ds := r.find("DaemonSet")[0]
	if !reflect.DeepEqual(pms[0].Get("spec", "selector", "matchLabels"), ds.Get("spec", "selector", "matchLabels")) {
		t.Errorf("PodMonitor selects %v, the DaemonSet's pods are %v", pms[0].Get("spec", "selector"), ds.Get("spec", "selector"))
	}
	if pms[0].Get("spec", "podMetricsEndpoints", 0, "port") != driverContainer(t, r).Get("ports", 0, "name") {
		t.Errorf("PodMonitor scrapes port %v, not the driver's metrics port", pms[0].Get("spec", "podMetricsEndpoints", 0, "port"))
	}
	for _, o := range []Object{pms[0], rules[0]} {
		if o.Get("metadata", "labels", "release") != "prom" || o.Get("metadata", "namespace") != Namespace {
			t.Errorf("%s: labels %v, namespace %v", o.Kind(), o.Get("metadata", "labels"), o.Get("metadata", "namespace"))
		}
	}

	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"podmonitor.yaml", "prometheusrule.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy/components/monitoring", f))
		if err != nil {
			t.Fatal(err)
		}
		var comp Object
		if err := yaml.Unmarshal(b, &comp); err != nil {
			t.Fatal(err)
		}
		got := r.find(comp.Kind())[0]
		if comp.Kind() == "PodMonitor" {
			if !reflect.DeepEqual(got.Get("spec", "podMetricsEndpoints"), comp.Get("spec", "podMetricsEndpoints")) {
				t.Errorf("PodMonitor endpoints differ from the component's:\n chart %v\n component %v", got.Get("spec", "podMetricsEndpoints"), comp.Get("spec", "podMetricsEndpoints"))
			}
			continue
		}
		if !reflect.DeepEqual(got.Get("spec"), comp.Get("spec")) {
			t.Errorf("the chart's PrometheusRule differs from deploy/components/monitoring/prometheusrule.yaml: change both")
		}
		if s := fmt.Sprint(got.Get("spec")); !strings.Contains(s, "{{ $labels.node }}") {
			t.Errorf("alert annotations lost Prometheus's {{ $labels.node }}")
		}
	}
}

// TestHelmWindowsEqualsOverlays: with windows.enabled the chart renders, for the
// scratch driver's defaults, the same Windows node plugin as the kustomize
// overlay of its mode (pod spec, selector, rollout; the chart's objects carry
// more labels), beside the Linux one unless linux.enabled is false; an unknown
// mode is refused.
func TestHelmWindowsEqualsOverlays(t *testing.T) {
	if r := helmObjects(t, map[string]any{}); len(r.find("DaemonSet")) != 1 {
		t.Errorf("default values: %d DaemonSets, want the Linux one only", len(r.find("DaemonSet")))
	}
	for mode, overlay := range map[string]string{"hostprocess": "deploy/overlays/windows-hostprocess", "csi-proxy": "deploy/overlays/windows-csi-proxy"} {
		t.Run(mode, func(t *testing.T) {
			r := helmObjects(t, map[string]any{"windows": map[string]any{"enabled": true, "mode": mode}})
			var linux, windows Object
			for _, ds := range r.find("DaemonSet") {
				switch ds.Name() {
				case "ephemera-scratch-node":
					linux = ds
				case "ephemera-scratch-node-windows":
					windows = ds
				}
			}
			if linux == nil || windows == nil || len(r.find("DaemonSet")) != 2 {
				t.Fatalf("%d DaemonSets, want the Linux one and ephemera-scratch-node-windows", len(r.find("DaemonSet")))
			}
			root, err := RepoRoot()
			if err != nil {
				t.Fatal(err)
			}
			b, err := Kustomize(filepath.Join(root, overlay))
			if err != nil {
				t.Fatal(err)
			}
			objs, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			k := rendered{Target{Name: overlay}, objs}.driverDaemonSet(t)
			for _, path := range [][]any{{"spec", "template", "spec"}, {"spec", "selector"}, {"spec", "updateStrategy"}} {
				if got, want := windows.Get(path...), k.Get(path...); !reflect.DeepEqual(got, want) {
					gy, _ := yaml.Marshal(got)
					wy, _ := yaml.Marshal(want)
					t.Errorf("%v differs between the chart and %s: change both\nchart:\n%s\noverlay:\n%s", path, overlay, gy, wy)
				}
			}
		})
	}
	if _, err := Helm(filepath.Join(mustRoot(t), Chart), map[string]any{"windows": map[string]any{"enabled": true, "mode": "process"}}, Namespace); err == nil {
		t.Errorf("windows.mode=process rendered, want a schema error")
	}
}

func mustRoot(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
