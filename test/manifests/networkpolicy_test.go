package manifests

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestMetricsExposure: the driver's /metrics, /healthz and /readyz have no
// authentication. A pod-network driver is isolated by a NetworkPolicy that admits
// only the named Prometheus, on the metrics port; a host-network driver (which no
// NetworkPolicy reaches) listens on loopback, and its probes go there.
func TestMetricsExposure(t *testing.T) {
	for _, r := range renderAll(t) {
		for _, ds := range r.find("DaemonSet") {
			if isPluginDaemonSet(ds) {
				continue // no port: TestPluginDaemonSet
			}
			t.Run(r.Name, func(t *testing.T) {
				driver := driverContainer(t, rendered{r.Target, []Object{ds}})
				addr := metricsAddress(driver)
				if addr == "" {
					t.Fatalf("driver has no --metrics-address: %v", driver.Get("args"))
				}
				if ds.Get("spec", "template", "spec", "hostNetwork") == true {
					if !strings.HasPrefix(addr, "127.0.0.1:") {
						t.Errorf("host-network driver: --metrics-address=%s, want 127.0.0.1:PORT (a NetworkPolicy does not apply to host-network pods)", addr)
					}
					for _, p := range []string{"livenessProbe", "readinessProbe"} {
						if h := driver.Get(p, "httpGet", "host"); h != "127.0.0.1" {
							t.Errorf("host-network driver: %s.httpGet.host = %v, want 127.0.0.1 (where it listens)", p, h)
						}
					}
					return
				}
				if h := driver.Get("livenessProbe", "httpGet", "host"); h != nil {
					t.Errorf("pod-network driver: livenessProbe.httpGet.host = %v: the kubelet must probe the pod IP", h)
				}
				port := addr[strings.LastIndex(addr, ":")+1:]
				nps := r.find("NetworkPolicy")
				if len(nps) != 1 {
					t.Fatalf("%d NetworkPolicies, want 1 isolating the driver's pods", len(nps))
				}
				checkMetricsPolicy(t, nps[0], ds, port)
			})
		}
	}
}

func metricsAddress(c Object) string {
	args, _ := c.Get("args").([]any)
	for _, a := range args {
		if s, _ := a.(string); strings.HasPrefix(s, "--metrics-address=") {
			return strings.TrimPrefix(s, "--metrics-address=")
		}
	}
	return ""
}

// checkMetricsPolicy: np selects ds's pods in ds's namespace, isolates them for
// ingress, and admits only selected peers (never everyone) on port only.
func checkMetricsPolicy(t *testing.T, np, ds Object, port string) {
	t.Helper()
	if got, want := np.Get("metadata", "namespace"), ds.Get("metadata", "namespace"); got != want {
		t.Errorf("NetworkPolicy namespace %v, DaemonSet's %v", got, want)
	}
	sel, _ := np.Get("spec", "podSelector", "matchLabels").(map[string]any)
	if len(sel) == 0 {
		t.Errorf("NetworkPolicy podSelector %v selects every pod of the namespace", np.Get("spec", "podSelector"))
	}
	podLabels, _ := ds.Get("spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("NetworkPolicy podSelector %s=%v does not select the driver's pods (labels %v)", k, v, podLabels)
		}
	}
	if got := fmt.Sprint(np.Get("spec", "policyTypes")); got != "[Ingress]" {
		t.Errorf("policyTypes %s, want [Ingress]", got)
	}
	rules, _ := np.Get("spec", "ingress").([]any)
	if len(rules) == 0 {
		t.Errorf("no ingress rule: nothing could scrape the metrics")
	}
	for i, ru := range rules {
		rule := Object(ru.(map[string]any))
		if got := fmt.Sprint(rule.Get("ports")); got != "[map[port:"+port+" protocol:TCP]]" {
			t.Errorf("ingress %d: ports %s, want only the metrics port %s/TCP", i, got, port)
		}
		from, _ := rule.Get("from").([]any)
		if len(from) == 0 {
			t.Errorf("ingress %d: no from: every source may connect", i)
		}
		for j, f := range from {
			peer := Object(f.(map[string]any))
			if peer.Get("podSelector") == nil || peer.Get("namespaceSelector") == nil {
				t.Errorf("ingress %d peer %d: %v, want both a namespaceSelector and a podSelector (the Prometheus pods)", i, j, peer)
			}
			if peer.Get("ipBlock") != nil {
				t.Errorf("ingress %d peer %d: ipBlock %v", i, j, peer.Get("ipBlock"))
			}
		}
	}
}

// TestHelmMetricsNetworkPolicy: the selectors come from values, and the policy can
// be turned off.
func TestHelmMetricsNetworkPolicy(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Helm(filepath.Join(root, Chart), map[string]any{"metrics": map[string]any{"port": 9999, "networkPolicy": map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"team": "observability"}},
		"podSelector": map[string]any{"matchExpressions": []any{map[string]any{
			"key": "app", "operator": "In", "values": []any{"prometheus", "vmagent"}}}},
	}}}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{Target{Name: "helm"}, objs}
	nps, dss := r.find("NetworkPolicy"), r.find("DaemonSet")
	if len(nps) != 1 || len(dss) != 1 {
		t.Fatalf("%d NetworkPolicies, %d DaemonSets", len(nps), len(dss))
	}
	checkMetricsPolicy(t, nps[0], dss[0], "9999")
	peer := Object(nps[0].Get("spec", "ingress", 0, "from", 0).(map[string]any))
	if peer.Get("namespaceSelector", "matchLabels", "team") != "observability" ||
		fmt.Sprint(peer.Get("podSelector", "matchExpressions", 0, "values")) != "[prometheus vmagent]" {
		t.Errorf("peer %v does not carry the values' selectors", peer)
	}

	b, err = Helm(filepath.Join(root, Chart), map[string]any{"metrics": map[string]any{"networkPolicy": map[string]any{"enabled": false}}}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "kind: NetworkPolicy") {
		t.Errorf("metrics.networkPolicy.enabled=false still renders the NetworkPolicy")
	}
	if _, err := Helm(filepath.Join(root, Chart), map[string]any{"metrics": map[string]any{"networkPolicy": map[string]any{
		"podSelector": map[string]any{"matchLabel": map[string]any{"app": "prometheus"}}}}}, Namespace); err == nil {
		t.Errorf("a misspelt selector (matchLabel) rendered, want a schema error")
	}
}
