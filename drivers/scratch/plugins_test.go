package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// --plugin is repeatable; each value names a backend, its socket and
// optionally the shared directory.
func TestPluginFlag(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("ephemera-scratch", flag.ContinueOnError)
	c.bindFlags(fs)
	if err := fs.Parse([]string{"--plugin=tokens=unix:///run/ephemera/plugins/tokens.sock",
		"--plugin", "cache=unix:///run/p/cache.sock,dir=/var/lib/ephemera/cache,max-content-bytes=8Mi,max-content-files=500"}); err != nil {
		t.Fatal(err)
	}
	want := pluginFlags{
		{name: "tokens", endpoint: "unix:///run/ephemera/plugins/tokens.sock"},
		{name: "cache", endpoint: "unix:///run/p/cache.sock", dir: "/var/lib/ephemera/cache", maxBytes: 8 << 20, maxFiles: 500},
	}
	if len(c.plugins) != len(want) || c.plugins[0] != want[0] || c.plugins[1] != want[1] {
		t.Errorf("parsed %+v, want %+v", c.plugins, want)
	}
	if got := c.plugins.String(); got != "tokens=unix:///run/ephemera/plugins/tokens.sock cache=unix:///run/p/cache.sock,dir=/var/lib/ephemera/cache,max-content-bytes=8388608,max-content-files=500" {
		t.Errorf("String() = %q", got)
	}
}

// Mistakes are refused at parse time with a message naming the value and
// what to do.
func TestPluginFlagRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--plugin=tokens"}, "is not NAME=unix:///path/plugin.sock"},
		{[]string{"--plugin==unix:///a.sock"}, "is not NAME="},
		{[]string{"--plugin=tokens="}, "is not NAME="},
		{[]string{"--plugin=tmpfs=unix:///a.sock"}, `"tmpfs" is a built-in backend of this driver`},
		{[]string{"--plugin=loop=unix:///a.sock"}, `"loop" is a built-in backend`},
		{[]string{"--plugin=vhdx=unix:///a.sock"}, `"vhdx" is a built-in backend`},
		{[]string{"--plugin=a=unix:///a.sock", "--plugin=a=unix:///b.sock"}, `a plugin named "a" is already configured (unix:///a.sock)`},
		{[]string{"--plugin=a b=unix:///a.sock"}, "may not contain spaces, commas or slashes"},
		{[]string{"--plugin=a/b=unix:///a.sock"}, "may not contain spaces, commas or slashes"},
		{[]string{"--plugin=a=/run/a.sock"}, "must be unix:///absolute/path.sock"},
		{[]string{"--plugin=a=unix://run/a.sock"}, "must be unix:///absolute/path.sock"},
		{[]string{"--plugin=a=tcp://127.0.0.1:80"}, "must be unix:///absolute/path.sock"},
		{[]string{"--plugin=a=unix:///run/../a.sock"}, "must be unix:///absolute/path.sock"},
		{[]string{"--plugin=a=unix:///a.sock,dir=rel"}, `dir="rel" must be a clean absolute path`},
		{[]string{"--plugin=a=unix:///a.sock,dir=/x/../y"}, "must be a clean absolute path"},
		{[]string{"--plugin=a=unix:///a.sock,max-content-bytes=-1"}, "must be a positive quantity like 16Mi"},
		{[]string{"--plugin=a=unix:///a.sock,max-content-bytes=4Gi"}, "below 2Gi"},
		{[]string{"--plugin=a=unix:///a.sock,max-content-bytes="}, "must be a positive quantity like 16Mi"},
		{[]string{"--plugin=a=unix:///a.sock,max-content-files=0"}, "must be a positive number"},
		{[]string{"--plugin=a=unix:///a.sock,size=1Gi"}, `unknown option "size=1Gi"`},
		// The last of an option given twice does not win: it is refused.
		{[]string{"--plugin=a=unix:///a.sock,dir=/srv/a,dir=/srv/b"}, "option dir= is given twice (dir=/srv/a and dir=/srv/b); give it once"},
		{[]string{"--plugin=a=unix:///a.sock,dir=/srv/a,max-content-files=5,dir=/srv/a"}, "option dir= is given twice"},
		{[]string{"--plugin=a=unix:///a.sock,max-content-bytes=8Mi,max-content-bytes=1Gi"}, "option max-content-bytes= is given twice (max-content-bytes=8Mi and max-content-bytes=1Gi)"},
		{[]string{"--plugin=a=unix:///a.sock,max-content-files=5,max-content-files=5"}, "option max-content-files= is given twice"},
	} {
		var c config
		fs := flag.NewFlagSet("ephemera-scratch", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.bindFlags(fs)
		err := fs.Parse(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-plugin") {
			t.Errorf("%q: %v, want an error about --plugin containing %q", tc.args, err, tc.want)
		}
	}
}

// Each plugin becomes a backend with a tmpfs of the driver's tmpfs flags,
// and the connections close.
func TestPluginBackends(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("ephemera-scratch", flag.ContinueOnError)
	c.bindFlags(fs)
	if err := fs.Parse([]string{"--tmpfs-max-inodes=5000", "--plugin=tokens=unix:///run/t.sock", "--plugin=cache=unix:///run/c.sock,dir=/srv/c"}); err != nil {
		t.Fatal(err)
	}
	made := 0
	newTmpfs := func() (*tmpfs.Backend, error) { made++; return c.tmpfs.backend(0) }
	plugins, err := c.plugins.backends(newTmpfs, DriverName, "node-1", klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(plugins) != 2 || plugins["tokens"].Name() != "tokens" || plugins["cache"].Name() != "cache" || made != 2 {
		t.Fatalf("plugins %v (%d tmpfs backends made)", plugins, made)
	}
	backends := map[string]framework.Backend{}
	if err := addPlugins(backends, plugins); err != nil || len(backends) != 2 {
		t.Fatalf("addPlugins: %v, %v", err, backends)
	}
	if err := addPlugins(backends, plugins); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("adding the same name twice: %v", err)
	}
	if err := closePlugins(plugins); err != nil {
		t.Errorf("close: %v", err)
	}

	// A content-only plugin's volumes are the tmpfs of the driver's flags:
	// --tmpfs-max-inodes=5000 caps nr_inodes.
	if runtime.GOOS != "linux" {
		return // tmpfs is Linux-only
	}
	sock := filepath.Join(t.TempDir(), "p.sock")
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- pluginserver.Serve(ctx, pluginserver.Options{Name: "files", Endpoint: "unix://" + sock,
			Content: framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return nil, nil })})
	}()
	defer func() { cancel(); <-served }()
	var pf pluginFlags
	if err := pf.Set("files=unix://" + sock); err != nil {
		t.Fatal(err)
	}
	live, err := pf.backends(newTmpfs, DriverName, "node-1", klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer closePlugins(live)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err = framework.ValidateVolume(live["files"], &api.Volume{Params: api.Params{tmpfs.ParamNrInodes: "6000"}, Size: 64 << 20})
		if err == nil || !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
	}
	if !errors.Is(err, api.ErrInvalidParams) || !strings.Contains(err.Error(), "5000") {
		t.Errorf("nr_inodes 6000 with --tmpfs-max-inodes=5000: %v, want it refused", err)
	}
	if err := framework.ValidateVolume(live["files"], &api.Volume{Params: api.Params{tmpfs.ParamNrInodes: "4000"}, Size: 64 << 20}); err != nil {
		t.Errorf("nr_inodes 4000 with --tmpfs-max-inodes=5000: %v", err)
	}

	// The tmpfs flags' own checks apply before any plugin is made.
	c.tmpfs.maxInodes = 0
	if _, err := c.plugins.backends(newTmpfs, DriverName, "node-1", klog.Background()); err == nil || !strings.Contains(err.Error(), "--tmpfs-max-inodes") {
		t.Errorf("--tmpfs-max-inodes=0: %v", err)
	}
}

// dir= is the most of the host a plugin can have bind-mounted into a pod: Set
// refuses a filesystem root, the kernel's filesystems and what hands out the
// node, as given; a directory beside them is accepted.
func TestPluginDirRefused(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("systemDirs are Linux paths")
	}
	for dir, want := range map[string]string{
		// Accepted: directories of their own, some with names that start like
		// refused ones (compared by component, not by string prefix).
		"/srv/c": "", "/var/lib/ephemera/plugins/c": "", "/run/ephemera/c": "", "/etc/ephemera": "",
		"/procfs": "", "/system": "", "/devices": "", "/var/lib/containerd2": "", "/var/log/pods2": "", "/run/crio-data": "",

		"/":                        "dir=/ is the root of the host's filesystem",
		"/proc":                    "dir=/proc is /proc (the kernel's proc filesystem)",
		"/proc/1/root":             "dir=/proc/1/root lies below /proc",
		"/sys":                     "dir=/sys is /sys (sysfs",
		"/sys/fs/cgroup":           "lies below /sys",
		"/sys/fs/bpf":              "lies below /sys",
		"/sys/kernel/debug":        "lies below /sys",
		"/sys/kernel/tracing":      "lies below /sys",
		"/sys/kernel/security":     "lies below /sys",
		"/dev":                     "dir=/dev is /dev",
		"/dev/shm":                 "lies below /dev",
		"/etc":                     "dir=/etc contains /etc/kubernetes (the kubelet's credentials)",
		"/etc/kubernetes/pki":      "lies below /etc/kubernetes",
		"/run":                     "dir=/run contains /run/containerd (a container runtime's socket)",
		"/var/run":                 "dir=/var/run contains /var/run/containerd",
		"/run/containerd/io":       "lies below /run/containerd",
		"/var":                     "dir=/var contains /var/lib/containerd (every container's files)",
		"/var/lib":                 "contains /var/lib/containerd",
		"/var/lib/docker/overlay2": "lies below /var/lib/docker",
		"/var/log":                 "contains /var/log/pods (every pod's logs)",
	} {
		var c config
		fs := flag.NewFlagSet("ephemera-scratch", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.bindFlags(fs)
		err := fs.Parse([]string{"--plugin=cache=unix:///run/ephemera/plugins/cache.sock,dir=" + dir})
		switch {
		case want == "" && err != nil:
			t.Errorf("dir=%s: %v", dir, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "-plugin") ||
			!strings.Contains(err.Error(), "give the plugin a directory of its own, e.g. dir=/var/lib/ephemera/plugins/cache")):
			t.Errorf("dir=%s: %v, want an error about --plugin containing %q", dir, err, want)
		}
	}
}

// Once every flag is parsed, dir= may not overlap the kubelet root, the state
// directory, a socket of the driver or of a plugin, another plugin's dir= or
// a kernel filesystem of the mount table, as given or with symbolic links
// resolved.
func TestPluginDirsChecked(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("symbolic links need a privilege on Windows; the mount table is Linux's")
	}
	root := t.TempDir()
	at := func(p string) string { return filepath.Join(root, filepath.FromSlash(p)) }
	for _, d := range []string{"kubelet/pods", "state/volumes", "data/kubelet/pods", "p"} {
		if err := os.MkdirAll(at(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// links/pods: the kubelet's pods under another name; kl: a kubelet root
	// given as a link.
	if err := os.Mkdir(at("links"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(at("kubelet/pods"), at("links/pods")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(at("data/kubelet"), at("kl")); err != nil {
		t.Fatal(err)
	}
	h := hostPaths{kubeletRoot: at("kubelet"), stateDir: at("state"), endpoint: "unix://" + at("csi/csi.sock"),
		mounts: []mount.MountInfo{
			{MountPoint: "/", FSType: "ext4"},
			{MountPoint: at("host/proc"), FSType: "proc"},
			{MountPoint: at("host/sys/fs/cgroup"), FSType: "cgroup2"},
			{MountPoint: at("host/tmp"), FSType: "tmpfs"},
		}}
	for _, tc := range []struct {
		name    string
		plugins []string // --plugin values; the first is the one checked
		h       hostPaths
		want    string // "" for accepted
	}{
		{"beside", []string{"a=unix:///run/a.sock,dir=" + at("p/a")}, h, ""},
		{"name that starts like the kubelet root", []string{"a=unix:///run/a.sock,dir=" + at("kubelet2")}, h, ""},
		{"name that starts like the state dir", []string{"a=unix:///run/a.sock,dir=" + at("state-cache")}, h, ""},
		{"a tmpfs of the mount table", []string{"a=unix:///run/a.sock,dir=" + at("host/tmp/a")}, h, ""},
		{"two plugins beside each other", []string{"a=unix:///run/a.sock,dir=" + at("p/a"), "b=unix:///run/b.sock,dir=" + at("p/b")}, h, ""},
		{"socket below dir's sibling", []string{"a=unix://" + at("p/sock/a.sock") + ",dir=" + at("p/a")}, h, ""},

		{"kubelet root", []string{"a=unix:///run/a.sock,dir=" + at("kubelet")}, h, "is --kubelet-root=" + at("kubelet") + " (every pod's volumes)"},
		{"below the kubelet root", []string{"a=unix:///run/a.sock,dir=" + at("kubelet/pods")}, h, "lies below --kubelet-root="},
		{"above the kubelet root", []string{"a=unix:///run/a.sock,dir=" + root}, h, "contains --kubelet-root="},
		{"state dir", []string{"a=unix:///run/a.sock,dir=" + at("state")}, h, "is --state-dir=" + at("state") + " (the driver's state and its dir and loop volumes)"},
		{"below the state dir", []string{"a=unix:///run/a.sock,dir=" + at("state/volumes")}, h, "lies below --state-dir="},
		{"the CSI socket", []string{"a=unix:///run/a.sock,dir=" + at("csi")}, h, "contains --endpoint=unix://" + at("csi/csi.sock") + " (the driver's CSI socket)"},
		{"its own socket", []string{"a=unix://" + at("p/a/a.sock") + ",dir=" + at("p/a")}, h, "contains the socket of plugin a"},
		{"another plugin's socket", []string{"a=unix:///run/a.sock,dir=" + at("p"), "b=unix://" + at("p/b.sock")}, h, "contains the socket of plugin b"},
		{"another plugin's dir", []string{"a=unix:///run/a.sock,dir=" + at("p"), "b=unix:///run/b.sock,dir=" + at("p/b")}, h, "contains the dir= of plugin b (" + at("p/b") + ")"},
		{"below another plugin's dir", []string{"a=unix:///run/a.sock,dir=" + at("p/b/a"), "b=unix:///run/b.sock,dir=" + at("p/b")}, h, "lies below the dir= of plugin b"},
		{"a link to the kubelet's pods", []string{"a=unix:///run/a.sock,dir=" + at("links/pods/x")}, h,
			"dir=" + at("links/pods/x") + " (" + at("kubelet/pods/x") + " once its symbolic links are resolved) lies below --kubelet-root="},
		{"a kubelet root given as a link", []string{"a=unix:///run/a.sock,dir=" + at("data")}, hostPaths{kubeletRoot: at("kl"), stateDir: at("state")},
			"contains --kubelet-root=" + at("kl") + " (every pod's volumes), " + at("data/kubelet") + " once its symbolic links are resolved"},
		{"a proc mount below", []string{"a=unix:///run/a.sock,dir=" + at("host")}, h, "contains " + at("host/proc") + ", where a proc filesystem is mounted (a kernel interface)"},
		{"in a cgroup mount", []string{"a=unix:///run/a.sock,dir=" + at("host/sys/fs/cgroup/a")}, h, "lies below " + at("host/sys/fs/cgroup") + ", where a cgroup2 filesystem is mounted"},
	} {
		var pf pluginFlags
		for _, v := range tc.plugins {
			if err := pf.Set(v); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		err := pf.checkDirs(tc.h)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "--plugin "+tc.plugins[0]+": dir=") ||
			!strings.Contains(err.Error(), "give the plugin a directory of its own")):
			t.Errorf("%s: %v, want an error naming --plugin %s containing %q", tc.name, err, tc.plugins[0], tc.want)
		}
	}
}

// config.validate checks dir= with the final values of --kubelet-root and
// --state-dir, or their defaults.
func TestValidatePluginDir(t *testing.T) {
	root := t.TempDir()
	var d config
	d.bindFlags(flag.NewFlagSet("ephemera-scratch", flag.ContinueOnError))
	defaultKubeletRoot := d.opts.Node.KubeletRootDir
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kubelet-root=" + root, "--plugin=a=unix:///run/a.sock,dir=" + filepath.Join(root, "pods")}, "lies below --kubelet-root=" + root},
		{[]string{"--state-dir=" + root, "--plugin=a=unix:///run/a.sock,dir=" + filepath.Join(root, "volumes")}, "lies below --state-dir=" + root},
		{[]string{"--plugin=a=unix:///run/a.sock,dir=" + filepath.Join(framework.DefaultStateDir(DriverName), "x")}, "lies below --state-dir=" + framework.DefaultStateDir(DriverName)},
		{[]string{"--kubelet-root=", "--plugin=a=unix:///run/a.sock,dir=" + filepath.Join(defaultKubeletRoot, "pods")}, "lies below --kubelet-root="},
		{[]string{"--kubelet-root=" + root, "--plugin=a=unix:///run/a.sock,dir=" + filepath.Join(t.TempDir(), "a")}, ""},
	} {
		var c config
		fs := flag.NewFlagSet("ephemera-scratch", flag.ContinueOnError)
		c.bindFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := c.validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
