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

// Content in memory-backed volumes is charged to the pod's memory cgroup where
// the node has pod cgroups (docs/operations.md, "Who pays for content in
// memory"): the Linux driver container mounts the host's cgroup tree, which
// on cgroup v1 it would not see otherwise, and tells the driver where.
const (
	hostCgroupPath  = "/sys/fs/cgroup"
	hostCgroupMount = "/host/sys/fs/cgroup"
)

// podCgroupFlags are the framework's flags of the charging mode, in the order
// the manifests pass them.
var podCgroupFlags = []string{"--pod-cgroups", "--pod-cgroup-mount", "--kubelet-cgroup-root", "--kubelet-cgroup-driver", "--pod-cgroup-wait"}

// defaultPodCgroupArgs are what every Linux driver container passes by
// default, kustomize and chart alike.
var defaultPodCgroupArgs = []string{"--pod-cgroups=auto", "--pod-cgroup-mount=" + hostCgroupMount, "--kubelet-cgroup-root=/", "--kubelet-cgroup-driver=auto"}

// podCgroupArgs returns c's args that set the charging mode, in order.
func podCgroupArgs(c Object) []string {
	var out []string
	for _, a := range stringList(c.Get("args")) {
		if slices.Contains(podCgroupFlags, flagName(a)) {
			out = append(out, a)
		}
	}
	return out
}

// hostCgroup returns ds's volume of the host's cgroup tree and the driver
// container's mount of it (nil when absent), and reports through t any other
// container that mounts it or any second such volume.
func hostCgroup(t *testing.T, ds Object) (vol, mount Object) {
	t.Helper()
	var names []string
	for name, v := range volumesOf(ds) {
		if p, _ := v.Get("hostPath", "path").(string); strings.HasPrefix(p, hostCgroupPath) {
			names = append(names, name)
			vol = v
		}
	}
	if len(names) > 1 {
		t.Errorf("%s: %d volumes of the host's cgroup tree %v, want one", ds.Name(), len(names), names)
	}
	if vol == nil {
		return nil, nil
	}
	for _, c := range containers(ds) {
		ms, _ := c.Get("volumeMounts").([]any)
		for _, m := range ms {
			mo := Object(m.(map[string]any))
			if mo.Name2() != vol.Name2() {
				continue
			}
			if c.Name2() != "driver" {
				t.Errorf("%s: container %s mounts the host's cgroup tree: only the driver needs it", ds.Name(), c.Name2())
				continue
			}
			mount = mo
		}
	}
	return vol, mount
}

// TestPodCgroups: every Linux driver DaemonSet (kustomize overlays, the chart,
// the example drivers) mounts the host's /sys/fs/cgroup into the driver
// container only, at /host/sys/fs/cgroup, read-write and without propagation,
// and passes the default charging flags naming that mount; the kustomize
// overlay and the chart render the same volume, mount and flags. The Windows
// node plugins and the plugin DaemonSet pass none of it: Windows falls back to
// the volume-size mode, and a plugin writes no content into pods' volumes.
func TestPodCgroups(t *testing.T) {
	type charging struct {
		args       []string
		vol, mount Object
	}
	got := map[string]charging{}
	for _, r := range renderAll(t) {
		if r.Kustomize == "deploy/admission" {
			continue
		}
		t.Run(r.Name, func(t *testing.T) {
			for _, ds := range r.find("DaemonSet") {
				vol, mount := hostCgroup(t, ds)
				var args []string
				for _, c := range containers(ds) {
					if a := podCgroupArgs(c); len(a) > 0 && c.Name2() != "driver" {
						t.Errorf("%s: container %s passes %v", ds.Name(), c.Name2(), a)
					}
					if c.Name2() == "driver" {
						args = podCgroupArgs(c)
					}
				}
				if r.windows() || isPluginDaemonSet(ds) {
					if vol != nil || len(args) > 0 {
						t.Errorf("%s: mounts %v, passes %v: want neither (Windows falls back, a plugin writes no content)", ds.Name(), vol, args)
					}
					continue
				}
				if !slices.Equal(args, defaultPodCgroupArgs) {
					t.Errorf("%s: driver passes %q, want %q", ds.Name(), args, defaultPodCgroupArgs)
				}
				if vol == nil || mount == nil {
					t.Fatalf("%s: the host's %s is not mounted into the driver container (volume %v, mount %v)", ds.Name(), hostCgroupPath, vol, mount)
				}
				if vol.Get("hostPath", "path") != hostCgroupPath || vol.Get("hostPath", "type") != "Directory" {
					t.Errorf("%s: volume %v, want hostPath %s of type Directory", ds.Name(), vol, hostCgroupPath)
				}
				// Read-write: the driver makes the writer's leaf cgroup (v2) and
				// moves the writer into the pod's cgroup (v1). No propagation: a
				// mount under the host's cgroup tree is none of the driver's.
				if mount.Get("mountPath") != hostCgroupMount || mount.Get("readOnly") == true || mount.Get("mountPropagation") != "None" {
					t.Errorf("%s: mount %v, want %s read-write with mountPropagation None", ds.Name(), mount, hostCgroupMount)
				}
				got[r.Name] = charging{args, vol, mount}
			}
		})
	}
	k, h := got["kustomize-linux"], got["helm-default"]
	if k.vol == nil || h.vol == nil {
		t.Fatalf("kustomize-linux or helm-default rendered no mount of the host's cgroup tree")
	}
	if !slices.Equal(k.args, h.args) || !reflect.DeepEqual(k.vol, h.vol) || !reflect.DeepEqual(k.mount, h.mount) {
		t.Errorf("the charging flags, volume or mount differ between deploy/overlays/linux and the chart: change both\nkustomize: %q\n%s%s\nchart: %q\n%s%s",
			k.args, toYAML(k.vol), toYAML(k.mount), h.args, toYAML(h.vol), toYAML(h.mount))
	}
}

// TestHelmPodCgroups: podCgroups.* reach the driver's flags, for the scratch
// driver and any other; mode off mounts nothing of the host's cgroup tree and
// passes only --pod-cgroups=off; the Windows DaemonSet never gets them; the
// schema refuses values the driver would.
func TestHelmPodCgroups(t *testing.T) {
	for name, c := range map[string]struct {
		vals  map[string]any
		args  []string
		mount bool
	}{
		"required, systemd, a root": {
			map[string]any{"podCgroups": map[string]any{"mode": "required", "kubeletCgroupRoot": "/k8s", "kubeletCgroupDriver": "systemd"}},
			[]string{"--pod-cgroups=required", "--pod-cgroup-mount=" + hostCgroupMount, "--kubelet-cgroup-root=/k8s", "--kubelet-cgroup-driver=systemd"}, true,
		},
		"another driver": {
			map[string]any{"driver": map[string]any{"name": "files.example.com", "args": []any{}}, "podCgroups": map[string]any{"kubeletCgroupDriver": "cgroupfs"}},
			[]string{"--pod-cgroups=auto", "--pod-cgroup-mount=" + hostCgroupMount, "--kubelet-cgroup-root=/", "--kubelet-cgroup-driver=cgroupfs"}, true,
		},
		"off": {
			map[string]any{"podCgroups": map[string]any{"mode": "off"}},
			[]string{"--pod-cgroups=off"}, false,
		},
		"windows too": {
			map[string]any{"windows": map[string]any{"enabled": true}},
			defaultPodCgroupArgs, true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := helmObjects(t, c.vals)
			for _, ds := range r.find("DaemonSet") {
				vol, mount := hostCgroup(t, ds)
				args := podCgroupArgs(container(ds, "driver"))
				if ds.Name() == "ephemera-scratch-node-windows" {
					if vol != nil || len(args) > 0 {
						t.Errorf("the Windows DaemonSet mounts %v, passes %v: want neither", vol, args)
					}
					continue
				}
				if !slices.Equal(args, c.args) {
					t.Errorf("%s: driver passes %q, want %q", ds.Name(), args, c.args)
				}
				if (vol != nil && mount != nil) != c.mount || (vol == nil) != (mount == nil) {
					t.Errorf("%s: volume %v, mount %v, want a mount of the host's cgroup tree: %v", ds.Name(), vol, mount, c.mount)
				}
			}
		})
	}
	root := mustRoot(t)
	for name, vals := range map[string]map[string]any{
		"mode on":          {"podCgroups": map[string]any{"mode": "on"}},
		"docker driver":    {"podCgroups": map[string]any{"kubeletCgroupDriver": "docker"}},
		"relative root":    {"podCgroups": map[string]any{"kubeletCgroupRoot": "kubepods"}},
		"unknown key":      {"podCgroups": map[string]any{"wait": "10s"}},
		"mode as a bool":   {"podCgroups": map[string]any{"mode": false}},
		"mode left empty":  {"podCgroups": map[string]any{"mode": ""}},
		"driver left null": {"podCgroups": map[string]any{"kubeletCgroupDriver": nil}},
	} {
		if _, err := Helm(filepath.Join(root, Chart), vals, Namespace); err == nil {
			t.Errorf("%s: %v rendered, want a schema error", name, vals)
		} else if !strings.Contains(fmt.Sprint(err), "podCgroups") {
			t.Errorf("%s: %v, want the error to name podCgroups", name, err)
		}
	}
}

func toYAML(o Object) string {
	b, _ := yaml.Marshal(o)
	return string(b)
}
