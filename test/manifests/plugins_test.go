package manifests

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The out-of-process plugin deployments (issue 12): the plugin as a sidecar of
// the node DaemonSet (deploy/components/plugin-sidecar through
// deploy/overlays/linux-plugin-sidecar, and the chart's plugins value), and as
// a DaemonSet of its own writing its socket into a host directory the driver
// mounts (deploy/plugin-daemonset).

// pluginSocket is where the tokens plugin listens in every target.
const pluginSocket = "/run/ephemera/plugins/tokens/tokens.sock"

// plugins reports whether the target deploys the tokens plugin.
func (r rendered) plugins() bool { return strings.Contains(r.Name, "plugin") }

// pluginDaemonSets is the number of plugin DaemonSets the target renders.
func (r rendered) pluginDaemonSets() int {
	if r.Kustomize == "deploy/plugin-daemonset" {
		return 1
	}
	return 0
}

// isPluginDaemonSet reports whether ds runs a plugin rather than the driver.
func isPluginDaemonSet(ds Object) bool {
	return ds.Get("metadata", "labels", "app.kubernetes.io/component") == "plugin"
}

// driverDaemonSet is the target's node DaemonSet.
func (r rendered) driverDaemonSet(t *testing.T) Object {
	t.Helper()
	for _, ds := range r.find("DaemonSet") {
		if !isPluginDaemonSet(ds) {
			return ds
		}
	}
	t.Fatalf("%s: no driver DaemonSet", r.Name)
	return nil
}

// container returns ds's container (or init container) named name.
func container(ds Object, name string) Object {
	for _, c := range containers(ds) {
		if c.Name2() == name {
			return c
		}
	}
	return nil
}

// volumesOf maps ds's volume names to their definitions.
func volumesOf(ds Object) map[string]Object {
	out := map[string]Object{}
	vols, _ := ds.Get("spec", "template", "spec", "volumes").([]any)
	for _, v := range vols {
		vo := Object(v.(map[string]any))
		out[vo.Name2()] = vo
	}
	return out
}

// mountsOf maps c's mount paths to the volume names mounted there.
func mountsOf(c Object) map[string]string {
	out := map[string]string{}
	ms, _ := c.Get("volumeMounts").([]any)
	for _, m := range ms {
		mo := Object(m.(map[string]any))
		out[fmt.Sprint(mo.Get("mountPath"))] = fmt.Sprint(mo.Get("name"))
	}
	return out
}

// checkUnprivileged: the plugin container runs as a non-root user with a
// read-only root, no capabilities, no privilege escalation, RuntimeDefault
// seccomp (its own or the pod's), and requests and a memory limit.
func checkUnprivileged(t *testing.T, ds, c Object) {
	t.Helper()
	pod := Object{"s": ds.Get("spec", "template", "spec", "securityContext")}
	get := func(key string) any {
		if v := c.Get("securityContext", key); v != nil {
			return v
		}
		return pod.Get("s", key)
	}
	if get("runAsNonRoot") != true {
		t.Errorf("%s: runAsNonRoot %v, want true", c.Name2(), get("runAsNonRoot"))
	}
	if uid, ok := get("runAsUser").(float64); !ok || uid == 0 {
		if uid, ok := get("runAsUser").(int64); !ok || uid == 0 {
			t.Errorf("%s: runAsUser %v, want a non-zero uid", c.Name2(), get("runAsUser"))
		}
	}
	if c.Get("securityContext", "privileged") == true || c.Get("securityContext", "allowPrivilegeEscalation") != false ||
		c.Get("securityContext", "readOnlyRootFilesystem") != true {
		t.Errorf("%s: securityContext %v, want unprivileged, no privilege escalation, read-only root", c.Name2(), c.Get("securityContext"))
	}
	if got := fmt.Sprint(c.Get("securityContext", "capabilities")); got != "map[drop:[ALL]]" {
		t.Errorf("%s: capabilities %s, want drop [ALL] and nothing added", c.Name2(), got)
	}
	seccomp := c.Get("securityContext", "seccompProfile", "type")
	if seccomp == nil {
		seccomp = pod.Get("s", "seccompProfile", "type")
	}
	if seccomp != "RuntimeDefault" {
		t.Errorf("%s: seccompProfile %v, want RuntimeDefault", c.Name2(), seccomp)
	}
	if c.Get("resources", "requests", "cpu") == nil || c.Get("resources", "requests", "memory") == nil || c.Get("resources", "limits", "memory") == nil {
		t.Errorf("%s: resources %v, want cpu+memory requests and a memory limit", c.Name2(), c.Get("resources"))
	}
	if why := pinned(fmt.Sprint(c.Get("image"))); why != "" {
		t.Errorf("%s: image %v: %s", c.Name2(), c.Get("image"), why)
	}
}

// checkDriverPluginFlag: the driver gets exactly --plugin=tokens=unix://<socket>.
func checkDriverPluginFlag(t *testing.T, driver Object) {
	t.Helper()
	var got []string
	for _, a := range stringList(driver.Get("args")) {
		if strings.HasPrefix(a, "--plugin") {
			got = append(got, a)
		}
	}
	if want := []string{"--plugin=tokens=unix://" + pluginSocket}; !slices.Equal(got, want) {
		t.Errorf("driver plugin flags %q, want %q", got, want)
	}
}

// TestPluginSidecars: the sidecar model. The plugin container shares only an
// emptyDir socket directory with the driver (mounted at the same path in
// both), mounts no host path, hides the driver's service-account token, and
// runs unprivileged; the driver gets --plugin; the CSIDriver requests the
// tokens' audience.
func TestPluginSidecars(t *testing.T) {
	n := 0
	for _, r := range renderAll(t) {
		if !r.plugins() || r.pluginDaemonSets() > 0 {
			continue
		}
		n++
		t.Run(r.Name, func(t *testing.T) {
			ds := r.driverDaemonSet(t)
			driver, plugin := container(ds, "driver"), container(ds, "plugin-tokens")
			if plugin == nil {
				t.Fatalf("no plugin-tokens container")
			}
			checkDriverPluginFlag(t, driver)
			checkUnprivileged(t, ds, plugin)
			vols := volumesOf(ds)
			sockDir := filepath.Dir(pluginSocket)
			pm, dm := mountsOf(plugin), mountsOf(driver)
			if pm[sockDir] == "" || pm[sockDir] != dm[sockDir] || vols[pm[sockDir]].Get("emptyDir") == nil {
				t.Errorf("socket dir %s: plugin mounts %q, driver %q (%v); want one emptyDir in both", sockDir, pm[sockDir], dm[sockDir], vols[pm[sockDir]])
			}
			for path, name := range pm {
				if vols[name].Get("hostPath") != nil {
					t.Errorf("plugin mounts host path %v at %s", vols[name].Get("hostPath"), path)
				}
			}
			if tok := pm["/var/run/secrets/kubernetes.io/serviceaccount"]; tok == "" || vols[tok].Get("emptyDir") == nil {
				t.Errorf("plugin container does not hide the driver's service-account token (an emptyDir at its mount path): %v", pm)
			}
			if got := fmt.Sprint(plugin.Get("args")); !strings.Contains(got, "plugin") {
				t.Errorf("plugin args %s: want tokenfile's plugin mode", got)
			}
			if ep := pluginEndpoint(plugin); ep != "unix://"+pluginSocket {
				t.Errorf("plugin listens on %q, want unix://%s", ep, pluginSocket)
			}
			checkTokenRequests(t, r)
		})
	}
	if n != 2 {
		t.Errorf("%d sidecar plugin targets, want 2 (kustomize, helm)", n)
	}
}

// pluginEndpoint is the plugin container's --endpoint, with $(PLUGIN_ENDPOINT)
// expanded from its env as the kubelet does.
func pluginEndpoint(c Object) string {
	env := map[string]string{}
	es, _ := c.Get("env").([]any)
	for _, e := range es {
		eo := Object(e.(map[string]any))
		if v, ok := eo.Get("value").(string); ok {
			env[eo.Name2()] = v
		}
	}
	for _, a := range stringList(c.Get("args")) {
		if v, ok := strings.CutPrefix(a, "--endpoint="); ok {
			for k, val := range env {
				v = strings.ReplaceAll(v, "$("+k+")", val)
			}
			return v
		}
	}
	return ""
}

func checkTokenRequests(t *testing.T, r rendered) {
	t.Helper()
	csi := r.find("CSIDriver")[0]
	if got := fmt.Sprint(csi.Get("spec", "tokenRequests")); !strings.Contains(got, "audience:vault") || csi.Get("spec", "requiresRepublish") != true {
		t.Errorf("CSIDriver tokenRequests %s, requiresRepublish %v: want audience vault, republished", got, csi.Get("spec", "requiresRepublish"))
	}
}

// TestPluginDaemonSet: the separate-DaemonSet model. The plugin's pods are
// unprivileged, get no service-account token, mount only their socket
// directory (a host path that must exist: type Directory); the driver mounts
// the plugins' parent directory at the same path, and its init container, root
// with CHOWN and FOWNER only, hands the plugin's directory to the plugin's uid.
func TestPluginDaemonSet(t *testing.T) {
	n := 0
	for _, r := range renderAll(t) {
		if r.pluginDaemonSets() == 0 {
			continue
		}
		n++
		t.Run(r.Name, func(t *testing.T) {
			var pds Object
			for _, ds := range r.find("DaemonSet") {
				if isPluginDaemonSet(ds) {
					pds = ds
				}
			}
			spec := Object{"s": pds.Get("spec", "template", "spec")}
			if spec.Get("s", "automountServiceAccountToken") != false {
				t.Errorf("plugin pods automount a service-account token")
			}
			if spec.Get("s", "hostNetwork") == true || spec.Get("s", "hostPID") == true || spec.Get("s", "hostIPC") == true {
				t.Errorf("plugin pods share a host namespace: %v", spec.Get("s"))
			}
			if pds.Get("metadata", "namespace") != Namespace {
				t.Errorf("plugin DaemonSet in namespace %v, want %s", pds.Get("metadata", "namespace"), Namespace)
			}
			cs := containers(pds)
			if len(cs) != 1 {
				t.Fatalf("plugin pods: %d containers, want 1", len(cs))
			}
			plugin := cs[0]
			checkUnprivileged(t, pds, plugin)
			if ep := pluginEndpoint(plugin); ep != "unix://"+pluginSocket {
				t.Errorf("plugin listens on %q, want unix://%s", ep, pluginSocket)
			}
			sockDir := filepath.Dir(pluginSocket)
			vols := volumesOf(pds)
			pm := mountsOf(plugin)
			if len(pm) != 1 || vols[pm[sockDir]].Get("hostPath", "path") != sockDir || vols[pm[sockDir]].Get("hostPath", "type") != "Directory" {
				t.Errorf("plugin mounts %v (volumes %v), want only host path %s (type Directory) at the same path", pm, vols, sockDir)
			}

			ds := r.driverDaemonSet(t)
			driver := container(ds, "driver")
			checkDriverPluginFlag(t, driver)
			dvols := volumesOf(ds)
			parent := filepath.Dir(sockDir)
			if v := dvols[mountsOf(driver)[parent]]; v.Get("hostPath", "path") != parent {
				t.Errorf("driver mounts %v at %s, want host path %s", v, parent, parent)
			}
			init := container(ds, "plugin-socket-dirs")
			if init == nil {
				t.Fatal("no init container plugin-socket-dirs in the driver's pods")
			}
			if got := fmt.Sprint(init.Get("command")); !strings.Contains(got, "chown 65532:65532 "+sockDir) || plugin.Get("securityContext", "runAsUser") != nil && fmt.Sprint(plugin.Get("securityContext", "runAsUser")) != "65532" {
				t.Errorf("init container %s does not hand %s to the plugin's uid 65532", got, sockDir)
			}
			if fmt.Sprint(spec.Get("s", "securityContext", "runAsUser")) != "65532" {
				t.Errorf("plugin pods run as %v, want 65532 (the uid the init container hands the directory to)", spec.Get("s", "securityContext", "runAsUser"))
			}
			if got := fmt.Sprint(init.Get("securityContext", "capabilities")); got != "map[add:[CHOWN FOWNER] drop:[ALL]]" || init.Get("securityContext", "privileged") == true {
				t.Errorf("init container capabilities %s, want only CHOWN and FOWNER", got)
			}
			if init.Get("image") != driver.Get("image") {
				t.Errorf("init container image %v, want the driver's %v (one version)", init.Get("image"), driver.Get("image"))
			}
			checkTokenRequests(t, r)
		})
	}
	if n != 1 {
		t.Errorf("%d plugin DaemonSet targets, want 1", n)
	}
}

// TestHelmPluginValues: the chart's plugins value. Admission allows the
// plugins' names; the schema refuses a built-in backend's name, a plugin
// without an image, unknown keys; a repeated name and plugins of a driver
// other than scratch fail the render; socketDir and args are honoured.
func TestHelmPluginValues(t *testing.T) {
	r := rendered{Target{Name: "helm-plugins"}, nil}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, Chart)
	b, err := Helm(chart, PluginValues(), Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if r.objs, err = Decode(b); err != nil {
		t.Fatal(err)
	}
	var policy Object
	for _, o := range r.objs {
		if o.Kind() == "ValidatingAdmissionPolicy" {
			policy = o
		}
	}
	if got := variable(policy, "allowedBackends"); got != `["tmpfs","loop","tokens"]` {
		t.Errorf("admission allowedBackends %s, want tmpfs, loop and the plugin tokens", got)
	}

	item := func(kv ...any) map[string]any {
		m := map[string]any{"name": "tokens", "image": map[string]any{"repository": "r.example/p", "tag": "v1"}}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	for name, tc := range map[string]struct {
		vals map[string]any
		want string
	}{
		"built-in name":  {map[string]any{"plugins": []any{item("name", "tmpfs")}}, "plugins"},
		"bad name":       {map[string]any{"plugins": []any{item("name", "Tokens_1")}}, "plugins"},
		"no image":       {map[string]any{"plugins": []any{map[string]any{"name": "x"}}}, "image"},
		"untagged image": {map[string]any{"plugins": []any{item("image", map[string]any{"repository": "r.example/p"})}}, "plugins"},
		"unknown key":    {map[string]any{"plugins": []any{item("socketdir", "/run/x")}}, "socketdir"},
		"relative dir":   {map[string]any{"plugins": []any{item("socketDir", "run/x")}}, "socketDir"},
		"twice":          {map[string]any{"plugins": []any{item(), item()}}, `name "tokens" appears twice`},
		"not scratch":    {map[string]any{"plugins": []any{item()}, "driver": map[string]any{"args": []any{}}}, "backends of the scratch driver"},
	} {
		if _, err := Helm(chart, tc.vals, Namespace); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", name, err, tc.want)
		}
	}

	b, err = Helm(chart, map[string]any{"plugins": []any{item("socketDir", "/var/run/p", "args", []any{"--socket=$(PLUGIN_ENDPOINT)"}, "runAsUser", 1234)}}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	ds := rendered{Target{}, objs}.find("DaemonSet")[0]
	driver, plugin := container(ds, "driver"), container(ds, "plugin-tokens")
	if !slices.Contains(stringList(driver.Get("args")), "--plugin=tokens=unix:///var/run/p/tokens.sock") ||
		mountsOf(driver)["/var/run/p"] != "plugin-tokens" || mountsOf(plugin)["/var/run/p"] != "plugin-tokens" {
		t.Errorf("socketDir /var/run/p: driver args %v, mounts %v / %v", driver.Get("args"), mountsOf(driver), mountsOf(plugin))
	}
	if got := stringList(plugin.Get("args")); !slices.Equal(got, []string{"--socket=$(PLUGIN_ENDPOINT)"}) {
		t.Errorf("plugin args %q", got)
	}
	if fmt.Sprint(plugin.Get("securityContext", "runAsUser")) != "1234" {
		t.Errorf("runAsUser %v, want 1234", plugin.Get("securityContext", "runAsUser"))
	}
}
