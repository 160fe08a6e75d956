package main

import (
	"context"
	"flag"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// pluginName is the plugin's name in its handshake.
const pluginName = "tokenfile"

// version is the plugin's version in its handshake.
var version = "dev"

// Plugin mode: the same content provider and authorizer, served out of
// process over the plugin protocol (framework/pluginserver) instead of in a
// driver of their own. Any Ephemera driver that takes plugins runs it, for
// example ephemera-scratch --plugin tokens=unix:///run/ephemera/plugins/tokens.sock;
// pods then select it with "backend: tokens", and that driver's CSIDriver
// lists the audiences in spec.tokenRequests. The plugin needs no privileges:
// the driver mounts the tmpfs and writes the files.
//
//	tokenfile plugin --endpoint=unix:///run/ephemera/plugins/tokens.sock [--allowed-namespaces=a,b]

// pluginBackend validates the volume in the plugin and leaves the storage to
// the driver: Create answers a tmpfs (with the pod's mode, uid, gid), which
// the driver mounts with its own size and inode caps. It exists because a
// content-only plugin (no Backend) accepts no attributes beyond tmpfs's.
type pluginBackend struct{ mem *tmpfs.Backend }

// Validate checks tokenfile's attributes and, the rest, tmpfs's; the default
// size is 1Mi.
func (b pluginBackend) Validate(v *api.Volume) error {
	if _, err := attributes.Parse(v.Params); err != nil {
		return err
	}
	tv := *v
	tv.Params = attributes.Split(v.Params)
	if _, ok := tv.Params[tmpfs.ParamNrInodes]; ok {
		// The protocol's tmpfs carries mode, uid and gid; the driver derives
		// nr_inodes from the size. Refused rather than ignored.
		return api.InvalidParamf("attribute %q is not available in plugin mode: the driver sets it from the size", tmpfs.ParamNrInodes)
	}
	if err := framework.ValidateVolume(b.mem, &tv); err != nil {
		return err
	}
	v.Size = tv.Size
	return nil
}

// Create returns the tmpfs the driver mounts, from tmpfs's attributes (the
// tmpfs backend refuses tokenfile's, as in Validate).
func (b pluginBackend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	tv := *v
	tv.Params = attributes.Split(v.Params)
	if err := b.mem.Attributes().Apply(&tv); err != nil {
		return api.Source{}, err
	}
	return b.mem.Create(ctx, &tv)
}

// Delete has nothing to free: the tmpfs goes with its mount.
func (pluginBackend) Delete(context.Context, *api.Volume) error { return nil }

// pluginContent is tokenFile with the attributes parsed here: the driver
// running the plugin does not know them.
func pluginContent(ctx context.Context, v *api.Volume) (map[string]api.File, error) {
	vals, err := attributes.Parse(v.Params)
	if err != nil {
		return nil, err
	}
	v.Values = vals
	return tokenFile(ctx, v)
}

// pluginOptions are the plugin server's options but the endpoint.
func pluginOptions(allowedNamespaces string) (pluginserver.Options, error) {
	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 1 << 20})
	if err != nil {
		return pluginserver.Options{}, err
	}
	csiDriverName = "the driver's CSIDriver object"
	return pluginserver.Options{
		Name:       pluginName,
		Version:    version,
		Backend:    pluginBackend{mem},
		Content:    framework.ContentFunc(pluginContent),
		Authorizer: allowNamespaces(allowedNamespaces),
	}, nil
}

// pluginMain runs the plugin until SIGINT or SIGTERM.
func pluginMain(args []string) error {
	fs := flag.NewFlagSet("tokenfile plugin", flag.ExitOnError)
	endpoint := fs.String("endpoint", "unix:///run/ephemera/plugins/tokens.sock", "the socket to serve the plugin on (the driver's --plugin NAME=ENDPOINT)")
	allowed := fs.String("allowed-namespaces", "", "comma-separated namespaces whose pods may use the plugin (empty: all)")
	klog.InitFlags(fs) // --v and the rest of klog's flags; calls are logged at 4
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts, err := pluginOptions(*allowed)
	if err != nil {
		return err
	}
	opts.Endpoint = *endpoint
	opts.Logger = klog.Background()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return pluginserver.Serve(ctx, opts)
}
