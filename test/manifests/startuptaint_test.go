package manifests

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const startupTaintKey = "ephemera.dev/scratch-not-ready"

// startupTaintKustomize renders overlay with the startup-taint
// component, as docs/operations.md tells to.
func startupTaintKustomize(t *testing.T, overlay string) rendered {
	t.Helper()
	root := mustRoot(t)
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	kust := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel(overlay) +
		"\ncomponents:\n- " + rel("deploy/components/startup-taint") + "\n"
	objs := kustomizeText(t, dir, kust)
	return rendered{Target{Name: overlay + "+startup-taint"}, objs}
}

func startupTaintHelm(t *testing.T, vals map[string]any) rendered {
	t.Helper()
	b, err := Helm(filepath.Join(mustRoot(t), Chart), vals, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return rendered{Target{Name: "helm"}, objs}
}

// startupTaintArgs are the driver container's --startup-taint flags, and its
// EPHEMERA_STARTUP_TAINT (the flag's default) as the flag it stands for.
func startupTaintArgs(t *testing.T, r rendered) []string {
	t.Helper()
	return driverFlags(r.driverDaemonSet(t))
}

func named(objs []Object, suffix string) Object {
	for _, o := range objs {
		if strings.HasSuffix(o.Name(), suffix) {
			return o
		}
	}
	return nil
}

// checkStartupTaint: the flag with key, a ClusterRole of exactly get/patch
// nodes and get csinodes bound to the driver's ServiceAccount, and the policy
// (bound, Deny) for that service account and key.
func checkStartupTaint(t *testing.T, r rendered, key string, flag bool) {
	t.Helper()
	want := []string{}
	if flag {
		want = []string{"--startup-taint=" + key}
	}
	if got := startupTaintArgs(t, r); !slices.Equal(got, want) {
		t.Errorf("%s: driver flags %q, want %q", r.Name, got, want)
	}
	role := named(r.find("ClusterRole"), "-startup-taint")
	if role == nil {
		t.Fatalf("%s: no ClusterRole *-startup-taint", r.Name)
	}
	if got := fmt.Sprint(role.Get("rules")); got != "[map[apiGroups:[] resources:[nodes] verbs:[get patch]] map[apiGroups:[storage.k8s.io] resources:[csinodes] verbs:[get]]]" {
		t.Errorf("%s: startup-taint rules %s", r.Name, got)
	}
	b := named(r.find("ClusterRoleBinding"), "-startup-taint")
	sa := r.find("ServiceAccount")[0]
	if b == nil || b.Get("roleRef", "name") != role.Name() || b.Get("subjects", 0, "name") != sa.Name() || b.Get("subjects", 0, "namespace") != Namespace {
		t.Errorf("%s: binding %v does not bind %s to the driver's ServiceAccount", r.Name, b, role.Name())
	}
	p := named(r.find("ValidatingAdmissionPolicy"), "-startup-taint")
	pb := named(r.find("ValidatingAdmissionPolicyBinding"), "-startup-taint")
	if p == nil || pb == nil || pb.Get("spec", "policyName") != p.Name() || fmt.Sprint(pb.Get("spec", "validationActions")) != "[Deny]" {
		t.Fatalf("%s: policy %v, binding %v", r.Name, p, pb)
	}
	if got, want := p.Get("spec", "matchConditions", 0, "expression"), "request.userInfo.username == 'system:serviceaccount:"+Namespace+":"+sa.Name()+"'"; got != want {
		t.Errorf("%s: policy matches %v, want %s", r.Name, got, want)
	}
	if got := p.Get("spec", "variables", 0, "expression"); got != "'"+key+"'" {
		t.Errorf("%s: policy key %v, want '%s'", r.Name, got, key)
	}
	if got := fmt.Sprint(p.Get("spec", "variables", 1, "expression")); !strings.Contains(got, "request.userInfo.extra['authentication.kubernetes.io/node-name']") {
		t.Errorf("%s: the policy does not read the token's node: %s", r.Name, got)
	}
	if p.Get("spec", "failurePolicy") != "Fail" || fmt.Sprint(p.Get("spec", "matchConstraints", "resourceRules")) != "[map[apiGroups:[] apiVersions:[v1] operations:[UPDATE] resources:[nodes]]]" {
		t.Errorf("%s: policy %v", r.Name, p.Get("spec"))
	}
}

// TestStartupTaint: the opt-in startup taint (deploy/components/startup-taint,
// the chart's startupTaint) renders the flag, the RBAC and the admission
// policy, the same in both; off by default.
func TestStartupTaint(t *testing.T) {
	for _, overlay := range []string{"deploy/overlays/linux", "deploy/overlays/linux-embedded-registrar",
		"deploy/overlays/windows-hostprocess", "deploy/overlays/windows-csi-proxy"} {
		k := startupTaintKustomize(t, overlay)
		checkStartupTaint(t, k, startupTaintKey, true)
		if !k.windows() {
			checkDaemonSet(t, k, k.driverDaemonSet(t))
		}
	}
	k := startupTaintKustomize(t, "deploy/overlays/linux")

	h := startupTaintHelm(t, map[string]any{"startupTaint": map[string]any{"enabled": true}})
	checkStartupTaint(t, h, startupTaintKey, true)
	// The chart and the component ship the same rules and policy.
	for _, kind := range []string{"ClusterRole", "ValidatingAdmissionPolicy"} {
		path := []any{"spec"}
		if kind == "ClusterRole" {
			path = []any{"rules"}
		}
		kg, hg := named(k.find(kind), "-startup-taint").Get(path...), named(h.find(kind), "-startup-taint").Get(path...)
		if !reflect.DeepEqual(kg, hg) {
			ky, _ := yaml.Marshal(kg)
			hy, _ := yaml.Marshal(hg)
			t.Errorf("%s differs between deploy/components/startup-taint and the chart: change both\nkustomize:\n%s\nchart:\n%s", kind, ky, hy)
		}
	}

	// Another key; another driver (driver.args set: the author passes the flag).
	checkStartupTaint(t, startupTaintHelm(t, map[string]any{"startupTaint": map[string]any{"enabled": true, "key": "example.com/storage-not-ready"}}),
		"example.com/storage-not-ready", true)
	checkStartupTaint(t, startupTaintHelm(t, map[string]any{"startupTaint": map[string]any{"enabled": true}, "driver": map[string]any{"args": []any{}}}),
		startupTaintKey, false)

	// Off by default: nothing of it.
	d := startupTaintHelm(t, map[string]any{})
	if len(startupTaintArgs(t, d)) != 0 || named(d.find("ClusterRole"), "-startup-taint") != nil || named(d.find("ValidatingAdmissionPolicy"), "-startup-taint") != nil {
		t.Errorf("the chart renders the startup taint by default")
	}
	for _, key := range []string{"not a key", "a/b/c", "-x"} {
		if _, err := Helm(filepath.Join(mustRoot(t), Chart), map[string]any{"startupTaint": map[string]any{"enabled": true, "key": key}}, Namespace); err == nil {
			t.Errorf("startupTaint.key %q rendered, want a schema error", key)
		}
	}
}

// driverFlags are the --startup-taint flags (and EPHEMERA_STARTUP_TAINT) of
// the driver container of ds.
func driverFlags(ds Object) []string {
	var out []string
	driver := container(ds, "driver")
	args, _ := driver.Get("args").([]any)
	for _, a := range args {
		if s := fmt.Sprint(a); strings.HasPrefix(s, "--startup-taint") {
			out = append(out, s)
		}
	}
	envs, _ := driver.Get("env").([]any)
	for _, e := range envs {
		if eo := Object(e.(map[string]any)); eo.Name2() == "EPHEMERA_STARTUP_TAINT" {
			out = append(out, fmt.Sprint("--startup-taint=", eo.Get("value")))
		}
	}
	return out
}

// toleratesStartupTaint reports whether ds's pods tolerate the taint key
// (effect NoSchedule), as the scheduler matches a toleration.
func toleratesStartupTaint(ds Object, key string) bool {
	ts, _ := ds.Get("spec", "template", "spec", "tolerations").([]any)
	for _, x := range ts {
		to := Object(x.(map[string]any))
		k, _ := to.Get("key").(string)
		op, _ := to.Get("operator").(string)
		eff, _ := to.Get("effect").(string)
		if eff != "" && eff != "NoSchedule" {
			continue
		}
		switch {
		case op == "Exists" && (k == "" || k == key):
			return true
		case (op == "" || op == "Equal") && k == key && to.Get("value") == nil:
			return true
		}
	}
	return false
}

// TestStartupTaintEveryDaemonSet: every DaemonSet of every deploy target
// (the drivers', Linux and Windows, and the plugins') starts on a node that
// still has the startup taint, and with the taint on (the component on every
// overlay of the scratch driver, the chart with its Linux and Windows node
// plugins) every driver DaemonSet, Linux or Windows, is the one that removes
// it: a DaemonSet left out would keep its nodes unschedulable for good.
func TestStartupTaintEveryDaemonSet(t *testing.T) {
	for _, r := range renderAll(t) {
		for _, ds := range r.find("DaemonSet") {
			if !toleratesStartupTaint(ds, startupTaintKey) {
				t.Errorf("%s: DaemonSet %s does not tolerate the startup taint %s:NoSchedule (tolerations %v)",
					r.Name, ds.Name(), startupTaintKey, ds.Get("spec", "template", "spec", "tolerations"))
			}
		}
	}
	var with []rendered
	for _, tg := range Targets() {
		if tg.Kustomize == "" || tg.Example != "" || tg.Kustomize == "deploy/admission" {
			continue
		}
		with = append(with, startupTaintKustomize(t, tg.Kustomize))
	}
	with = append(with, startupTaintHelm(t, map[string]any{"startupTaint": map[string]any{"enabled": true}, "windows": map[string]any{"enabled": true}}),
		startupTaintHelm(t, map[string]any{"startupTaint": map[string]any{"enabled": true}, "windows": map[string]any{"enabled": true, "mode": "csi-proxy"}}))
	for _, r := range with {
		n := 0
		for _, ds := range r.find("DaemonSet") {
			if isPluginDaemonSet(ds) {
				continue
			}
			n++
			if got, want := driverFlags(ds), []string{"--startup-taint=" + startupTaintKey}; !slices.Equal(got, want) {
				t.Errorf("%s: DaemonSet %s: driver flags %q, want %q", r.Name, ds.Name(), got, want)
			}
			if !toleratesStartupTaint(ds, startupTaintKey) {
				t.Errorf("%s: DaemonSet %s does not tolerate the startup taint", r.Name, ds.Name())
			}
		}
		if n == 0 {
			t.Errorf("%s: no driver DaemonSet", r.Name)
		}
	}
}
