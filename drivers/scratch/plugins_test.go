package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
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
		err = live["files"].Validate(&api.Volume{Params: api.Params{tmpfs.ParamNrInodes: "6000"}, Size: 64 << 20})
		if err == nil || !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
	}
	if !errors.Is(err, api.ErrInvalidParams) || !strings.Contains(err.Error(), "5000") {
		t.Errorf("nr_inodes 6000 with --tmpfs-max-inodes=5000: %v, want it refused", err)
	}
	if err := live["files"].Validate(&api.Volume{Params: api.Params{tmpfs.ParamNrInodes: "4000"}, Size: 64 << 20}); err != nil {
		t.Errorf("nr_inodes 4000 with --tmpfs-max-inodes=5000: %v", err)
	}

	// The tmpfs flags' own checks apply before any plugin is made.
	c.tmpfs.maxInodes = 0
	if _, err := c.plugins.backends(newTmpfs, DriverName, "node-1", klog.Background()); err == nil || !strings.Contains(err.Error(), "--tmpfs-max-inodes") {
		t.Errorf("--tmpfs-max-inodes=0: %v", err)
	}
}
