package main

import (
	"context"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/ephemera-csi/ephemera/framework/events/eventstest"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/events"
	"github.com/ephemera-csi/ephemera/framework/kube"
)

// The flags are an interface: README.md lists them, and the manifests and the
// e2e tests pass them.
func TestFlags(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("ephemera-scratch", flag.ContinueOnError)
	c.bindFlags(fs)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	want := []string{
		"backend", "backends", "capacity", "content-bytes-in-flight", "content-capacity", "content-timeout", "default-size", "dir-soft-size", "driver-name", "endpoint", "events",
		"fleet-daemonset", "gc-confirm-with-api", "gc-dry-run", "gc-interval", "gc-max-orphan-share", "in-flight-reserved-per-backend", "keep-binary-pages", "kubeconfig", "kubelet-cgroup-driver", "kubelet-cgroup-root", "kubelet-root", "log-format",
		"loop-default-size", "loop-fstype", "loop-preallocate", "max-in-flight", "max-in-flight-per-backend", "max-volume-size", "max-volumes-per-node", "max-volumes-per-pod",
		"memory-limit", "metrics-address", "mount-options", "nodeid", "operation-timeout", "orphan-grace-period", "plugin", "pod-cgroup-mount", "pod-cgroup-wait", "pod-cgroups", "provision-timeout", "register", "startup-taint", "state-dir", "state-recovery",
		"stats-cache-ttl", "stats-max-depth", "stats-max-entries", "stats-max-linked-files", "stats-max-walks", "stats-timeout",
		"tmpfs-max-inodes", "version", "vhdx-default-size", "vhdx-dynamic", "volumes-endpoint", "windows-mode",
	}
	if !slices.Equal(names, want) {
		t.Errorf("flags %q, want %q", names, want)
	}
	backends, backend := "tmpfs,dir,loop", "tmpfs"
	if runtime.GOOS == "windows" {
		backends, backend = "dir,vhdx", "dir"
	}
	for name, def := range map[string]string{
		"backends": backends, "backend": backend, "driver-name": DriverName, "loop-fstype": "ext4",
		"tmpfs-max-inodes": "1048576", "windows-mode": "hostprocess", "events": "false", "gc-confirm-with-api": "false", "volumes-endpoint": "true",
		"pod-cgroups": "auto", "pod-cgroup-mount": "/sys/fs/cgroup", "kubelet-cgroup-root": "/", "kubelet-cgroup-driver": "auto", "pod-cgroup-wait": "10s",
	} {
		if got := fs.Lookup(name).DefValue; got != def {
			t.Errorf("--%s defaults to %q, want %q", name, got, def)
		}
	}

	if err := fs.Parse([]string{"--backends=dir", "--default-size=64Mi", "--tmpfs-max-inodes=5", "--dir-soft-size",
		"--loop-fstype=xfs", "--loop-default-size=1Gi", "--loop-preallocate", "--vhdx-default-size=2Gi", "--vhdx-dynamic",
		"--events", "--gc-confirm-with-api", "--kubeconfig=k", "--startup-taint=ephemera.dev/scratch-not-ready", "--max-volume-size=4Gi", "--capacity=tmpfs=1Gi", "--nodeid=n"}); err != nil {
		t.Fatal(err)
	}
	if c.backends != "dir" || c.maxVolumeSize != "4Gi" || c.capacity != "tmpfs=1Gi" ||
		c.tmpfs != (tmpfsFlags{defaultSize: "64Mi", maxInodes: 5}) ||
		c.dir != (dirFlags{softSize: true}) ||
		c.loop != (loopFlags{fsType: "xfs", defaultSize: "1Gi", preallocate: true}) ||
		c.vhdx != (vhdxFlags{defaultSize: "2Gi", dynamic: true}) ||
		c.api != (apiFlags{events: true, gcConfirm: true, kubeconfig: "k", startupTaint: "ephemera.dev/scratch-not-ready"}) {
		t.Errorf("parsed %+v %+v %+v %+v %+v %q %q %q", c.tmpfs, c.dir, c.loop, c.vhdx, c.api, c.backends, c.maxVolumeSize, c.capacity)
	}
	if c.opts.Node.ID != "n" || c.opts.DriverName != DriverName {
		t.Errorf("options %+v", c.opts)
	}
}

// --events and --gc-confirm-with-api add the recorder and the pod informer to
// the options, each both where the driver uses it and among the Runnables the
// driver runs.
func TestAddComponents(t *testing.T) {
	clientset := fake.NewClientset()
	csiDrivers := &kube.Client{}
	client := apiClient{
		events:     eventstest.Client{C: clientset},
		pods:       clientset.CoreV1().Pods(""),
		csiDrivers: csiDrivers,
		nodes:      csiDrivers,
	}
	opts := framework.Options{DriverName: DriverName, Node: framework.NodeOptions{ID: "node-1"}}
	if err := (apiFlags{}).addComponents(&opts, client); err != nil || opts.Observability.Events != nil || opts.GC.Pods != nil || opts.Observability.CSIDrivers != nil || len(opts.Runnables) != 0 {
		t.Fatalf("without flags: %v, %+v", err, opts)
	}
	if err := (apiFlags{events: true, gcConfirm: true}).addComponents(&opts, client); err != nil {
		t.Fatal(err)
	}
	rec, ok := opts.Observability.Events.(*events.Recorder)
	if !ok {
		t.Fatalf("Events is %T, want an *events.Recorder", opts.Observability.Events)
	}
	pods, ok := opts.GC.Pods.(*kube.Pods)
	if !ok {
		t.Fatalf("Pods is %T, want a *kube.Pods", opts.GC.Pods)
	}
	if len(opts.Runnables) != 2 || opts.Runnables[0] != rec || opts.Runnables[1] != pods {
		t.Errorf("Runnables %v, want the recorder and the pod informer", opts.Runnables)
	}
	if opts.Observability.CSIDrivers != csiDrivers {
		t.Errorf("CSIDrivers %v, want the API client (the startup check of the CSIDriver object)", opts.Observability.CSIDrivers)
	}
	// Either flag gives API access, and the check.
	opts = framework.Options{DriverName: DriverName, Node: framework.NodeOptions{ID: "node-1"}}
	if err := (apiFlags{events: true}).addComponents(&opts, client); err != nil || opts.Observability.CSIDrivers != csiDrivers {
		t.Errorf("--events alone: %v, CSIDrivers %v", err, opts.Observability.CSIDrivers)
	}
	// --startup-taint alone: API access (not the CSIDriver check), and the
	// taint's remover among the Runnables.
	opts = framework.Options{DriverName: DriverName, Node: framework.NodeOptions{ID: "node-1"}}
	if !(apiFlags{startupTaint: "ephemera.dev/scratch-not-ready"}).enabled() || (apiFlags{}).enabled() {
		t.Errorf("--startup-taint does not ask for the API client, or no flag does")
	}
	if err := (apiFlags{startupTaint: "ephemera.dev/scratch-not-ready"}).addComponents(&opts, client); err != nil {
		t.Fatal(err)
	}
	if len(opts.Runnables) != 1 || opts.Observability.CSIDrivers != nil {
		t.Fatalf("--startup-taint: Runnables %v, CSIDrivers %v", opts.Runnables, opts.Observability.CSIDrivers)
	}
	if _, ok := opts.Runnables[0].(*kube.StartupTaint); !ok {
		t.Errorf("Runnable %T, want a *kube.StartupTaint", opts.Runnables[0])
	}
	if err := (apiFlags{startupTaint: "not a key"}).addComponents(&opts, client); err == nil || !strings.Contains(err.Error(), "--startup-taint") {
		t.Errorf("--startup-taint='not a key': %v", err)
	}
	if n := len(clientset.Actions()); n != 0 {
		t.Errorf("%d API calls before the driver runs, want none", n)
	}

	// --fleet-daemonset: the pod informer and the CSIDriver check share one
	// read of the DaemonSet's size, made when they first ask.
	sizes := &fakeDaemonSets{n: 1000}
	client.daemonSets = sizes
	stateDir := t.TempDir()
	opts = framework.Options{DriverName: DriverName, Node: framework.NodeOptions{ID: "node-1", StateDir: stateDir}}
	if err := (apiFlags{events: true, gcConfirm: true, fleetDaemonSet: "kube-system/ephemera-scratch-node"}).addComponents(&opts, client); err != nil {
		t.Fatal(err)
	}
	if opts.Observability.FleetSize == nil || len(sizes.asked) != 0 {
		t.Fatalf("--fleet-daemonset: FleetSize %v, %d reads before the driver runs", opts.Observability.FleetSize != nil, len(sizes.asked))
	}
	for range 2 {
		if n, err := opts.Observability.FleetSize(t.Context()); n != 1000 || err != nil {
			t.Errorf("FleetSize = %d, %v, want 1000", n, err)
		}
	}
	if !slices.Equal(sizes.asked, []string{"kube-system/ephemera-scratch-node"}) {
		t.Errorf("DaemonSet reads %q, want one of kube-system/ephemera-scratch-node", sizes.asked)
	}
	// Without --events or --gc-confirm-with-api nothing spreads: not read.
	opts = framework.Options{DriverName: DriverName, Node: framework.NodeOptions{ID: "node-1"}}
	if err := (apiFlags{fleetDaemonSet: "kube-system/x"}).addComponents(&opts, client); err != nil || opts.Observability.FleetSize != nil {
		t.Errorf("--fleet-daemonset alone: %v, FleetSize set %v", err, opts.Observability.FleetSize != nil)
	}
	if err := (apiFlags{events: true, fleetDaemonSet: "a/b/c"}).addComponents(&opts, client); err == nil || !strings.Contains(err.Error(), "--fleet-daemonset") {
		t.Errorf("--fleet-daemonset=a/b/c: %v", err)
	}
}

func TestCSIProxyModeRefusals(t *testing.T) {
	for _, tc := range []struct {
		backends string
		plugins  int
		want     string // "" for no error
	}{
		{"dir", 0, ""},
		{" dir ,", 0, ""},
		{"dir,vhdx", 0, "vhdx needs --windows-mode=hostprocess: csi-proxy v1 cannot create or attach a VHDX"},
		{"tmpfs", 0, `"tmpfs" is not available with --windows-mode=csi-proxy`},
		{"dir", 1, "--plugin is not available with --windows-mode=csi-proxy"},
	} {
		err := csiProxyRefuses(tc.backends, tc.plugins)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("csiProxyRefuses(%q, %d) = %v, want %q", tc.backends, tc.plugins, err, tc.want)
		}
	}
	if got, want := csiProxyDirRoot(filepath.FromSlash("/var/lib/kubelet"), DriverName),
		filepath.FromSlash("/var/lib/kubelet/plugins/"+DriverName+"/volumes"); got != want {
		t.Errorf("csiProxyDirRoot = %s, want %s", got, want)
	}
}

// --capacity takes one budget per backend: a backend given twice is refused
// (the first won), naming both budgets.
func TestParseCapacity(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]int64
		err  string // "" for accepted
	}{
		{"", nil, ""},
		{"tmpfs=1Gi", map[string]int64{"tmpfs": 1 << 30}, ""},
		{"tmpfs=1Gi, loop=200Gi", map[string]int64{"tmpfs": 1 << 30, "loop": 200 << 30}, ""},
		{"tmpfs=1Gi,tokens=64Mi", map[string]int64{"tmpfs": 1 << 30, "tokens": 64 << 20}, ""},

		{"tmpfs=1Gi,tmpfs=2Gi", nil, "--capacity=tmpfs=1Gi,tmpfs=2Gi: backend tmpfs is given twice (tmpfs=1Gi and tmpfs=2Gi); give each backend one budget"},
		{"tmpfs=1Gi,loop=1Gi, tmpfs=1Gi", nil, "backend tmpfs is given twice"},
		{"tmpfs", nil, `--capacity: "tmpfs" is not backend=quantity`},
		{"=1Gi", nil, "is not backend=quantity"},
		{"tmpfs=1Gi,", nil, `--capacity: "" is not backend=quantity`},
		{"tmpfs=0", nil, `--capacity tmpfs="0" is not a positive quantity`},
		{"tmpfs=lots", nil, "is not a positive quantity"},
	} {
		got, err := parseCapacity(tc.in)
		switch {
		case tc.err == "" && (err != nil || !maps.Equal(got, tc.want)):
			t.Errorf("--capacity=%s: %v, %v, want %v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("--capacity=%s: %v, want an error containing %q", tc.in, err, tc.err)
		}
	}
}

// fakeDaemonSets answers DaemonSetSize with n and records what was read.
type fakeDaemonSets struct {
	n     int
	asked []string
}

func (f *fakeDaemonSets) DaemonSetSize(_ context.Context, namespace, name string) (int, error) {
	f.asked = append(f.asked, namespace+"/"+name)
	return f.n, nil
}

// --fleet-daemonset takes NAMESPACE/NAME, or NAME in the pod's own namespace
// (the service account mount's file); anything else is refused with the flag.
func TestFleetDaemonSetFlag(t *testing.T) {
	nsFile := filepath.Join(t.TempDir(), "namespace")
	if err := os.WriteFile(nsFile, []byte("kube-system"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ flag, file, ns, name string }{
		{"team/ephemera-scratch-node", "/nonexistent", "team", "ephemera-scratch-node"},
		{"ephemera-scratch-node", nsFile, "kube-system", "ephemera-scratch-node"},
	} {
		ns, name, err := fleetDaemonSet(c.flag, c.file)
		if err != nil || ns != c.ns || name != c.name {
			t.Errorf("%q: %q %q %v, want %q %q", c.flag, ns, name, err, c.ns, c.name)
		}
	}
	for _, c := range []struct{ flag, file, says string }{
		{"ephemera-scratch-node", "/nonexistent", "names no namespace"},
		{"a/b/c", nsFile, "want NAME or NAMESPACE/NAME"},
		{"/x", nsFile, "want NAME or NAMESPACE/NAME"},
		{"x/", nsFile, "want NAME or NAMESPACE/NAME"},
	} {
		if _, _, err := fleetDaemonSet(c.flag, c.file); err == nil || !strings.Contains(err.Error(), "--fleet-daemonset="+c.flag) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: %v, want an error saying %q", c.flag, err, c.says)
		}
	}
}
