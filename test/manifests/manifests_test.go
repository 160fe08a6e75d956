package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const driverName = "scratch.csi.ephemera.dev"

type rendered struct {
	Target
	objs []Object
}

func renderAll(t *testing.T) []rendered {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var out []rendered
	for _, tg := range Targets() {
		b, err := Render(root, tg)
		if err != nil {
			t.Fatalf("%s: %v", tg.Name, err)
		}
		objs, err := Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", tg.Name, err)
		}
		if len(objs) == 0 {
			t.Fatalf("%s: no objects", tg.Name)
		}
		out = append(out, rendered{tg, objs})
	}
	return out
}

// kustomizeText renders a kustomization.yaml of text written into dir (an
// operator's overlay of the shipped ones).
func kustomizeText(t *testing.T, dir, text string) []Object {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := Kustomize(dir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func (r rendered) find(kind string) []Object {
	var out []Object
	for _, o := range r.objs {
		if o.Kind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// windows reports whether the target is the Windows HostProcess overlay (owned
// and tested by its own invariants elsewhere; here only the shared ones).
func (r rendered) windows() bool { return strings.Contains(r.Name, "windows") }

// example reports whether the target deploys an example driver (examples/*):
// checked against the example's own files by TestExamples, here only the
// invariants every driver shares.
func (r rendered) example() bool { return r.Example != "" }

// driverName is the name of the target's CSIDriver (the scratch driver's when it
// renders none).
func (r rendered) driverName() string {
	if ds := r.find("CSIDriver"); len(ds) == 1 {
		return ds[0].Name()
	}
	return driverName
}

// embedded reports whether the target registers through the driver (--register).
func (r rendered) embedded() bool { return strings.Contains(r.Name, "embedded") }

func TestHelmLint(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range Targets() {
		if tg.Kustomize != "" {
			continue
		}
		vals, err := tg.Values(root)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := Lint(filepath.Join(root, Chart), vals)
		if err != nil {
			t.Errorf("%s: %v", tg.Name, err)
		}
		for _, m := range msgs {
			t.Logf("%s: %s", tg.Name, m)
		}
	}
}

func TestHelmRejectsBadValues(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range map[string]map[string]any{
		"registrar mode":              {"registrar": map[string]any{"mode": "both"}},
		"unknown backend":             {"scratch": map[string]any{"backends": map[string]any{"enabled": []any{"tmpfs", "ramdisk"}}}},
		"negative volumes":            {"maxVolumesPerNode": -1},
		"zero tmpfs inodes":           {"scratch": map[string]any{"tmpfsMaxInodes": 0}},
		"args not flags":              {"driver": map[string]any{"args": []any{"register"}}},
		"zero admission inodes":       {"admission": map[string]any{"maxInodes": 0}},
		"zero volumes per pod":        {"admission": map[string]any{"maxVolumesPerPod": 0}},
		"volumes per pod as a string": {"admission": map[string]any{"maxVolumesPerPod": "16"}},
		"inodes as a quantity":        {"admission": map[string]any{"maxInodes": "1Mi"}},
	} {
		if _, err := Helm(filepath.Join(root, Chart), vals, Namespace); err == nil {
			t.Errorf("%s: rendered, want an error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestCSIDriver(t *testing.T) {
	for _, r := range renderAll(t) {
		if r.Kustomize == "deploy/admission" {
			continue
		}
		ds := r.find("CSIDriver")
		if len(ds) != 1 {
			t.Errorf("%s: %d CSIDrivers, want 1", r.Name, len(ds))
			continue
		}
		d := ds[0]
		want := map[string]any{"podInfoOnMount": true, "attachRequired": false}
		if !r.example() {
			if d.Name() != driverName {
				t.Errorf("%s: CSIDriver %q, want %q", r.Name, d.Name(), driverName)
			}
			// The tokens plugin's targets refresh tokens (requiresRepublish).
			want["requiresRepublish"], want["fsGroupPolicy"] = r.plugins(), "File"
		}
		for field, want := range want {
			if got := d.Get("spec", field); got != want {
				t.Errorf("%s: CSIDriver spec.%s = %v, want %v", r.Name, field, got, want)
			}
		}
		if got := fmt.Sprint(d.Get("spec", "volumeLifecycleModes")); got != "[Ephemeral]" {
			t.Errorf("%s: volumeLifecycleModes %s, want [Ephemeral]", r.Name, got)
		}
		if got := d.Get("metadata", "labels", "security.openshift.io/csi-ephemeral-volume-profile"); got != "restricted" {
			t.Errorf("%s: OpenShift profile label = %v, want restricted", r.Name, got)
		}
	}
}

func TestDaemonSet(t *testing.T) {
	for _, r := range renderAll(t) {
		if r.Kustomize == "deploy/admission" {
			continue
		}
		dss := r.find("DaemonSet")
		if want := 1 + r.pluginDaemonSets(); len(dss) != want {
			t.Fatalf("%s: %d DaemonSets, want %d", r.Name, len(dss), want)
		}
		// A plugin's DaemonSet rolls as the driver's (10%, one pod per node).
		for _, pds := range dss {
			if isPluginDaemonSet(pds) {
				t.Run(r.Name+"/"+pds.Name(), func(t *testing.T) { checkRollout(t, pds) })
			}
		}
		ds := r.driverDaemonSet(t)
		if r.windows() {
			t.Run(r.Name, func(t *testing.T) { checkRollout(t, ds); checkMemoryLimit(t, ds); checkMemoryPlan(t, ds, true) })
			continue
		}
		t.Run(r.Name, func(t *testing.T) { checkDaemonSet(t, r, ds); checkMemoryLimit(t, ds); checkMemoryPlan(t, ds, false) })
	}
}

// checkMemoryLimit: every node DaemonSet, Linux or Windows, has a memory limit
// on its driver container and passes it to the driver (--memory-limit from
// limits.memory through the downward API), which keeps Go's heap under three
// quarters of it.
func checkMemoryLimit(t *testing.T, ds Object) {
	containers, _ := ds.Get("spec", "template", "spec", "containers").([]any)
	for _, c := range containers {
		driver := Object(c.(map[string]any))
		if driver.Name2() != "driver" {
			continue
		}
		if driver.Get("resources", "limits", "memory") == nil {
			t.Errorf("driver: no memory limit: %v", driver.Get("resources"))
		}
		if args := fmt.Sprint(driver.Get("args")); !strings.Contains(args, "--memory-limit=$(MEMORY_LIMIT)") {
			t.Errorf("driver args lack --memory-limit=$(MEMORY_LIMIT): %s", args)
		}
		envs, _ := driver.Get("env").([]any)
		found := false
		for _, e := range envs {
			eo := Object(e.(map[string]any))
			if eo.Name2() == "MEMORY_LIMIT" {
				found = eo.Get("valueFrom", "resourceFieldRef", "containerName") == "driver" &&
					eo.Get("valueFrom", "resourceFieldRef", "resource") == "limits.memory"
			}
		}
		if !found {
			t.Errorf("driver env lacks MEMORY_LIMIT from the driver container's limits.memory: %v", envs)
		}
		return
	}
	t.Errorf("no driver container")
}

// checkRollout: every node DaemonSet, Linux or Windows.
func checkRollout(t *testing.T, ds Object) {
	if ds.Get("metadata", "namespace") != Namespace {
		t.Errorf("namespace %v, want %s", ds.Get("metadata", "namespace"), Namespace)
	}
	checkStrategy(t, ds, "10%")
	if got := ds.Get("spec", "template", "spec", "priorityClassName"); got != "system-node-critical" {
		t.Errorf("priorityClassName %v", got)
	}
}

// checkStrategy: the rendered rollout of a node DaemonSet is RollingUpdate with
// maxUnavailable exactly unavailable (a string "N%" or an int, as the API
// server reads it) and maxSurge 0: never two drivers on one node's state.
func checkStrategy(t *testing.T, ds Object, unavailable any) {
	t.Helper()
	ru := ds.Get("spec", "updateStrategy", "rollingUpdate")
	got := fmt.Sprintf("%v surge=%#v unavailable=%#v", ds.Get("spec", "updateStrategy", "type"),
		ds.Get("spec", "updateStrategy", "rollingUpdate", "maxSurge"), ds.Get("spec", "updateStrategy", "rollingUpdate", "maxUnavailable"))
	if want := fmt.Sprintf("RollingUpdate surge=0 unavailable=%#v", unavailable); got != want {
		t.Errorf("%s: updateStrategy %s (%v), want %s (never two drivers on one node's state)", ds.Name(), got, ru, want)
	}
}

// checkDaemonSet: the Linux node DaemonSet.
func checkDaemonSet(t *testing.T, r rendered, ds Object) {
	checkRollout(t, ds)
	spec := Object{"s": ds.Get("spec", "template", "spec")}
	if got := spec.Get("s", "priorityClassName"); got != "system-node-critical" {
		t.Errorf("priorityClassName %v", got)
	}
	if got := fmt.Sprint(spec.Get("s", "tolerations")); got != "[map[operator:Exists]]" {
		t.Errorf("tolerations %s, want [{operator: Exists}]", got)
	}
	if got := spec.Get("s", "nodeSelector", "kubernetes.io/os"); got != "linux" {
		t.Errorf("nodeSelector kubernetes.io/os = %v", got)
	}
	if sa := spec.Get("s", "serviceAccountName"); sa == nil || len(r.find("ServiceAccount")) != 1 || r.find("ServiceAccount")[0].Name() != sa {
		t.Errorf("serviceAccountName %v does not name the rendered ServiceAccount", sa)
	}

	containers, _ := spec.Get("s", "containers").([]any)
	var names []string
	var driver Object
	for _, c := range containers {
		co := Object(c.(map[string]any))
		names = append(names, co.Name2())
		if co.Name2() == "driver" {
			driver = co
		}
		if co.Get("resources", "requests", "cpu") == nil || co.Get("resources", "requests", "memory") == nil || co.Get("resources", "limits", "memory") == nil {
			t.Errorf("container %s: resources %v, want cpu+memory requests and a memory limit", co.Name2(), co.Get("resources"))
		}
		// A plugin container has no HTTP endpoint to probe; one that exits is
		// restarted, and while it is down publishes fail with Unavailable.
		if co.Get("livenessProbe") == nil && !strings.HasPrefix(co.Name2(), "plugin-") {
			t.Errorf("container %s: no livenessProbe", co.Name2())
		}
	}
	if driver == nil {
		t.Fatalf("no driver container in %v", names)
	}
	// Plugin sidecars (plugin-NAME) are checked by TestPluginSidecars.
	names = slices.DeleteFunc(names, func(n string) bool { return strings.HasPrefix(n, "plugin-") })
	if r.embedded() {
		if !slices.Equal(names, []string{"driver"}) {
			t.Errorf("containers %v, want only the driver (embedded registrar: no sidecars)", names)
		}
	} else if !slices.Contains(names, "node-driver-registrar") || len(names) != 2 {
		t.Errorf("containers %v, want driver + node-driver-registrar", names)
	}

	if driver.Get("securityContext", "privileged") != true {
		t.Errorf("driver not privileged")
	}
	args := strings.Fields(fmt.Sprint(driver.Get("args")))
	argSet := strings.Join(args, " ")
	driverName := r.driverName()
	wantArgs := []string{"--nodeid=$(NODE_NAME)", "--metrics-address=:9809",
		"--state-dir=/var/lib/ephemera/" + driverName, "--endpoint=unix:///var/lib/kubelet/plugins/" + driverName + "/csi.sock"}
	if !r.example() {
		wantArgs = append(wantArgs, "--driver-name="+driverName, "--events", "--tmpfs-max-inodes="+maxInodes)
	}
	for _, want := range wantArgs {
		if !strings.Contains(argSet, want) {
			t.Errorf("driver args lack %s: %v", want, args)
		}
	}
	if got := strings.Contains(argSet, "--register"); got != r.embedded() {
		t.Errorf("--register in args = %v, want %v", got, r.embedded())
	}
	envs, _ := driver.Get("env").([]any)
	if !slices.ContainsFunc(envs, func(e any) bool {
		eo := Object(e.(map[string]any))
		return eo.Name2() == "NODE_NAME" && eo.Get("valueFrom", "fieldRef", "fieldPath") == "spec.nodeName"
	}) {
		t.Errorf("env NODE_NAME from spec.nodeName missing: %v", driver.Get("env"))
	}
	if driver.Get("livenessProbe", "httpGet", "path") != "/healthz" || driver.Get("readinessProbe", "httpGet", "path") != "/readyz" {
		t.Errorf("probes: liveness %v, readiness %v", driver.Get("livenessProbe"), driver.Get("readinessProbe"))
	}

	// Host paths: volume name -> host path, and the driver's mounts.
	hostPaths := map[string]string{}
	vols, _ := spec.Get("s", "volumes").([]any)
	for _, v := range vols {
		vo := Object(v.(map[string]any))
		if p, ok := vo.Get("hostPath", "path").(string); ok {
			hostPaths[vo.Name2()] = p
		}
	}
	mounts := map[string]Object{} // host path -> mount
	ms, _ := driver.Get("volumeMounts").([]any)
	for _, m := range ms {
		mo := Object(m.(map[string]any))
		if hp, ok := hostPaths[fmt.Sprint(mo.Get("name"))]; ok {
			mounts[hp] = mo
		}
	}
	pods := mounts["/var/lib/kubelet/pods"]
	if pods == nil || pods.Get("mountPropagation") != "Bidirectional" || pods.Get("mountPath") != "/var/lib/kubelet/pods" {
		t.Errorf("driver: /var/lib/kubelet/pods must be mounted at the same path with Bidirectional propagation, got %v", pods)
	}
	for _, hp := range []string{"/var/lib/kubelet/plugins/" + driverName, "/var/lib/ephemera/" + driverName, "/dev"} {
		if m := mounts[hp]; m == nil || m.Get("mountPath") != hp {
			t.Errorf("driver: host path %s not mounted at the same path: %v", hp, m)
		}
	}
	for hp := range mounts {
		if strings.HasPrefix(hp, "/tmp") {
			t.Errorf("host path %s under /tmp", hp)
		}
	}
	if _, ok := mounts["/var/lib/kubelet/plugins_registry"]; ok != r.embedded() {
		t.Errorf("driver mounts plugins_registry = %v, want %v", ok, r.embedded())
	}
}

// TestFleetDaemonSet: every driver DaemonSet whose driver has start-up work
// to spread (--events, --gc-confirm-with-api) names itself in
// --fleet-daemonset, and the ClusterRole lets it read that DaemonSet (TestRBAC).
func TestFleetDaemonSet(t *testing.T) {
	n := 0
	for _, r := range renderAll(t) {
		for _, ds := range r.find("DaemonSet") {
			driver := container(ds, "driver")
			if isPluginDaemonSet(ds) || driver == nil {
				continue
			}
			args := fmt.Sprint(driver.Get("args"))
			var flags []string
			for _, a := range strings.Fields(strings.Trim(args, "[]")) {
				if strings.HasPrefix(a, "--fleet-daemonset") {
					flags = append(flags, a)
				}
			}
			if !strings.Contains(args, "--events") && !strings.Contains(args, "--gc-confirm-with-api") {
				continue
			}
			n++
			if want := []string{"--fleet-daemonset=" + ds.Name()}; !slices.Equal(flags, want) {
				t.Errorf("%s: DaemonSet %s: %q, want %q", r.Name, ds.Name(), flags, want)
			}
			if roles := r.find("ClusterRole"); len(roles) == 0 || roles[0].Name() != ds.Name() {
				t.Errorf("%s: DaemonSet %s is not the one the ClusterRole %v lets the driver read", r.Name, ds.Name(), roles)
			}
		}
	}
	if n == 0 {
		t.Error("no DaemonSet passes --events or --gc-confirm-with-api")
	}
}

func TestRBAC(t *testing.T) {
	for _, r := range renderAll(t) {
		if r.Kustomize == "deploy/admission" {
			continue
		}
		roles := r.find("ClusterRole")
		bindings := r.find("ClusterRoleBinding")
		if len(roles) != 1 || len(bindings) != 1 {
			t.Fatalf("%s: %d ClusterRoles, %d bindings, want 1 each", r.Name, len(roles), len(bindings))
		}
		var got []string
		rules, _ := roles[0].Get("rules").([]any)
		for _, ru := range rules {
			ro := Object(ru.(map[string]any))
			rule := fmt.Sprint(ro.Get("apiGroups"), ro.Get("resources"), ro.Get("verbs"))
			if names := ro.Get("resourceNames"); names != nil {
				rule += fmt.Sprint(" ", names)
			}
			got = append(got, rule)
		}
		// The startup check reads the target's own CSIDriver object only.
		name := driverName
		if cd := r.find("CSIDriver"); len(cd) == 1 {
			name = cd[0].Name()
		}
		// The size of the driver's Linux DaemonSet (--fleet-daemonset): that
		// object only, which every target names as its ClusterRole.
		ds := roles[0].Name()
		want := []string{"[] [pods] [list watch]", "[] [events] [create patch]", "[storage.k8s.io] [csidrivers] [get] [" + name + "]",
			"[apps] [daemonsets] [get] [" + ds + "]"}
		if !slices.Equal(got, want) {
			t.Errorf("%s: ClusterRole rules %q, want exactly %q", r.Name, got, want)
		}
		b := bindings[0]
		sa := r.find("ServiceAccount")[0]
		if b.Get("roleRef", "name") != roles[0].Name() || b.Get("subjects", 0, "name") != sa.Name() || b.Get("subjects", 0, "namespace") != Namespace {
			t.Errorf("%s: binding %v does not bind the role to %s/%s", r.Name, b, Namespace, sa.Name())
		}
	}
}

func TestAdmissionPolicy(t *testing.T) {
	for _, r := range renderAll(t) {
		if r.Kustomize != "" && r.Kustomize != "deploy/admission" {
			continue // the overlays leave the policy to deploy/admission
		}
		ps, bs := r.find("ValidatingAdmissionPolicy"), r.find("ValidatingAdmissionPolicyBinding")
		if len(ps) != 1 || len(bs) != 1 {
			t.Fatalf("%s: %d policies, %d bindings, want 1 each", r.Name, len(ps), len(bs))
		}
		p, b := ps[0], bs[0]
		if b.Get("spec", "policyName") != p.Name() || fmt.Sprint(b.Get("spec", "validationActions")) != "[Deny]" {
			t.Errorf("%s: binding %v", r.Name, b.Get("spec"))
		}
		if p.Get("spec", "failurePolicy") != "Fail" {
			t.Errorf("%s: failurePolicy %v, want Fail", r.Name, p.Get("spec", "failurePolicy"))
		}
		text := fmt.Sprint(p.Get("spec"))
		wants := []string{r.driverName(), "tmpfs", "csi.storage.k8s.io/", "kubectl label namespace", "volumeAttributes.nr_inodes", "at most " + maxVolumesPerPod + " inline volumes"}
		if !r.example() {
			wants = append(wants, "ephemera.dev/scratch-allowed", "4Gi", "loop")
		}
		for _, want := range wants {
			if !strings.Contains(text, want) {
				t.Errorf("%s: policy does not mention %q", r.Name, want)
			}
		}
		if r.example() {
			// An author's driver: the condition and the messages name it, not the
			// scratch driver or its sizes.
			for _, not := range []string{"scratch", "256Mi"} {
				if strings.Contains(text, not) {
					t.Errorf("%s: policy of %s mentions %q", r.Name, r.driverName(), not)
				}
			}
			want := "uses-" + strings.ReplaceAll(r.driverName(), ".", "-") + "-inline"
			if got := p.Get("spec", "matchConditions", 0, "name"); got != want {
				t.Errorf("%s: match condition %v, want %s", r.Name, got, want)
			}
		}
		// The nr_inodes cap: a variable equal to the driver's --tmpfs-max-inodes,
		// and a rule that applies it to every volume with nr_inodes.
		if got := variable(p, "maxInodes"); got != maxInodes {
			t.Errorf("%s: variable maxInodes = %q, want %s (the driver's --tmpfs-max-inodes)", r.Name, got, maxInodes)
		}
		if !hasValidation(p, "'nr_inodes' in a", "int(a['nr_inodes']) <= variables.maxInodes", "string(variables.maxInodes)") {
			t.Errorf("%s: no validation caps nr_inodes at variables.maxInodes (and names the cap)", r.Name)
		}
		// The cap on inline volumes per pod: a variable equal to the driver's
		// --max-volumes-per-pod, and a rule that counts the pod's volumes of
		// this driver only (variables.volumes) against it.
		if got := variable(p, "maxVolumesPerPod"); got != maxVolumesPerPod {
			t.Errorf("%s: variable maxVolumesPerPod = %q, want %s (the driver's --max-volumes-per-pod)", r.Name, got, maxVolumesPerPod)
		}
		if got := variable(p, "volumes"); !strings.Contains(got, "v.csi.driver == ") || !strings.Contains(got, r.driverName()) {
			t.Errorf("%s: variable volumes = %q, want the pod's volumes of %s only", r.Name, got, r.driverName())
		}
		if !hasValidation(p, "size(variables.volumes) <= variables.maxVolumesPerPod", "string(size(variables.volumes))", "string(variables.maxVolumesPerPod)", "fewer volumes") {
			t.Errorf("%s: no validation caps the pod's volumes of the driver at variables.maxVolumesPerPod (and names the count and the cap)", r.Name)
		}
		vals, _ := p.Get("spec", "validations").([]any)
		for i, v := range vals {
			vo := Object(v.(map[string]any))
			if msg, _ := vo.Get("message").(string); msg == "" || strings.Contains(msg, "\n") {
				t.Errorf("%s: validation %d: message %q must be one line", r.Name, i, msg)
			}
		}
	}
}

func TestHelmNotes(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	n, err := Notes(filepath.Join(root, Chart), map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n, "kubectl label namespace NAMESPACE ephemera.dev/scratch-allowed=true") {
		t.Errorf("NOTES.txt does not tell how to allow a namespace:\n%s", n)
	}
	if !strings.Contains(n, "nr_inodes <= "+maxInodes+" ") {
		t.Errorf("NOTES.txt does not state the nr_inodes cap:\n%s", n)
	}
	if !strings.Contains(n, "at most "+maxVolumesPerPod+" volumes per pod") {
		t.Errorf("NOTES.txt does not state the cap on volumes per pod:\n%s", n)
	}
}

// maxInodes is the default cap on nr_inodes, of the driver and of the policy.
const maxInodes = "1048576"

// maxVolumesPerPod is the default cap on a pod's inline volumes of the
// driver, of the driver (--max-volumes-per-pod) and of the policy.
const maxVolumesPerPod = "16"

// variable returns the expression of the policy variable name, "" if absent.
func variable(policy Object, name string) string {
	vars, _ := policy.Get("spec", "variables").([]any)
	for _, v := range vars {
		if vo := Object(v.(map[string]any)); vo.Name2() == name {
			s, _ := vo.Get("expression").(string)
			return s
		}
	}
	return ""
}

// hasValidation reports whether one validation's expression and
// messageExpression together contain all of subs.
func hasValidation(policy Object, subs ...string) bool {
	vals, _ := policy.Get("spec", "validations").([]any)
	for _, v := range vals {
		vo := Object(v.(map[string]any))
		text := fmt.Sprint(vo.Get("expression"), "\n", vo.Get("messageExpression"))
		if !slices.ContainsFunc(subs, func(s string) bool { return !strings.Contains(text, s) }) {
			return true
		}
	}
	return false
}

// TestHelmOptions: values reach the objects.
func TestHelmOptions(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{
		"driver":            map[string]any{"name": "scratch.example.com"},
		"maxVolumesPerNode": 50,
		"image":             map[string]any{"repository": "registry.example.com/scratch", "tag": "v9"},
		"csiDriver": map[string]any{"requiresRepublish": true,
			"tokenRequests": []any{map[string]any{"audience": "vault", "expirationSeconds": 3600}}},
		"metrics":   map[string]any{"port": 9999},
		"admission": map[string]any{"maxSize": "1Gi", "maxInodes": 5000, "maxVolumesPerPod": 4, "allowedBackends": []any{"tmpfs"}, "namespaceLabel": map[string]any{"key": "example.com/scratch", "value": "yes"}},
		"scratch": map[string]any{
			"capacity":     map[string]any{"tmpfs": "8Gi"},
			"backends":     map[string]any{"enabled": []any{"tmpfs"}, "default": "tmpfs"},
			"mountOptions": map[string]any{"tmpfs": []any{"noexec", "noatime"}, "loop": []any{}},
			// Above 2^32 and as a float64, as values.yaml's numbers are: rendered whole.
			"tmpfsMaxInodes": 4294967296.0,
		},
	}
	b, err := Helm(filepath.Join(root, Chart), vals, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{
		"name: scratch.example.com", "requiresRepublish: true", "audience: vault",
		"--capacity=loop=50Gi,tmpfs=8Gi", "--mount-options=tmpfs=noexec,noatime\n", "--max-volumes-per-node=50", "--backends=tmpfs\n", "--metrics-address=:9999",
		"containerPort: 9999", `image: "registry.example.com/scratch:v9"`,
		"/var/lib/kubelet/plugins/scratch.example.com/csi.sock", "/var/lib/ephemera/scratch.example.com",
		`v.csi.driver == "scratch.example.com"`, `expression: "\"1Gi\""`, `expression: "[\"tmpfs\"]"`,
		`expression: "5000"`, "from 1 to 5000: every file", "--tmpfs-max-inodes=4294967296\n",
		`expression: "4"`, "at most 4 inline volumes of the CSI driver scratch.example.com:",
		`namespaceObject.metadata.labels["example.com/scratch"] == "yes"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("rendered chart lacks %q", want)
		}
	}
	b, err = Helm(filepath.Join(root, Chart), map[string]any{"admission": map[string]any{"enabled": false}}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s, "--mount-options=loop") {
		t.Errorf("an empty list of mount options renders a flag")
	}
	if strings.Contains(string(b), "ValidatingAdmissionPolicy") {
		t.Errorf("admission.enabled=false still renders the policy")
	}
	n, err := Notes(filepath.Join(root, Chart), map[string]any{"admission": map[string]any{"enabled": false}})
	if err != nil || !strings.Contains(n, "WARNING: admission.enabled=false") {
		t.Errorf("NOTES.txt without admission lacks the warning (%v):\n%s", err, n)
	}
}

// TestWindowsCSIProxyDaemonSet: the csi-proxy overlay's node plugin is an
// ordinary Windows container (no HostProcess, no host network) that mounts
// csi-proxy's filesystem pipe (only that one) and the kubelet root at their
// host paths, runs the driver in --windows-mode=csi-proxy with the dir
// backend only, and registers through the registrar sidecar; the HostProcess
// overlay stays HostProcess.
func TestWindowsCSIProxyDaemonSet(t *testing.T) {
	for _, r := range renderAll(t) {
		if r.Kustomize != "deploy/overlays/windows-csi-proxy" && r.Kustomize != "deploy/overlays/windows-hostprocess" {
			continue
		}
		ds := r.driverDaemonSet(t)
		spec := Object{"s": ds.Get("spec", "template", "spec")}
		hostProcess := spec.Get("s", "securityContext", "windowsOptions", "hostProcess") == true
		if r.Kustomize == "deploy/overlays/windows-hostprocess" {
			if !hostProcess {
				t.Errorf("%s: not HostProcess", r.Name)
			}
			continue
		}
		if hostProcess || spec.Get("s", "hostNetwork") == true {
			t.Errorf("%s: hostProcess %v, hostNetwork %v: the csi-proxy model is an ordinary container", r.Name, hostProcess, spec.Get("s", "hostNetwork"))
		}
		if u := spec.Get("s", "securityContext", "windowsOptions", "runAsUserName"); u != "ContainerAdministrator" {
			t.Errorf("%s: runAsUserName %v, want ContainerAdministrator (writes the CSI socket and the state into hostPath mounts)", r.Name, u)
		}
		hostPaths := map[string]string{} // volume name -> host path
		vols, _ := spec.Get("s", "volumes").([]any)
		for _, v := range vols {
			o := Object{"v": v}
			if p, ok := o.Get("v", "hostPath", "path").(string); ok {
				hostPaths[fmt.Sprint(o.Get("v", "name"))] = p
			}
		}
		driver := driverContainer(t, rendered{r.Target, []Object{ds}})
		mounted := map[string]string{} // host path -> mount path
		mounts, _ := driver.Get("volumeMounts").([]any)
		for _, m := range mounts {
			o := Object{"m": m}
			if p, ok := hostPaths[fmt.Sprint(o.Get("m", "name"))]; ok {
				mounted[p] = fmt.Sprint(o.Get("m", "mountPath"))
			}
		}
		for _, p := range []string{`\\.\pipe\csi-proxy-filesystem-v1`, `C:\var\lib\kubelet`} {
			if mounted[p] != p {
				t.Errorf("%s: host path %s mounted at %q, want the same path", r.Name, p, mounted[p])
			}
		}
		for p := range mounted {
			if strings.HasPrefix(p, `\\.\pipe\`) && p != `\\.\pipe\csi-proxy-filesystem-v1` {
				t.Errorf("%s: mounts %s: the dir backend needs csi-proxy's filesystem pipe only", r.Name, p)
			}
		}
		args := stringList(driver.Get("args"))
		for _, want := range []string{"--windows-mode=csi-proxy", "--backends=dir", `--kubelet-root=C:\var\lib\kubelet`} {
			if !slices.Contains(args, want) {
				t.Errorf("%s: driver args %v lack %s", r.Name, args, want)
			}
		}
		if slices.Contains(args, "--register") {
			t.Errorf("%s: --register beside the registrar sidecar", r.Name)
		}
		var registrar bool
		cs, _ := spec.Get("s", "containers").([]any)
		for _, c := range cs {
			registrar = registrar || (Object{"c": c}).Get("c", "name") == "node-driver-registrar"
		}
		if !registrar {
			t.Errorf("%s: no node-driver-registrar container", r.Name)
		}
	}
}
