// Command tokenfile is an Ephemera driver that mounts the pod's own
// service-account token for one audience, as a file that the kubelet refreshes
// through requiresRepublish. A pod chooses the audience with the volume
// attribute "audience"; the CSIDriver object must request a token for it in
// spec.tokenRequests.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
)

const driverName = "tokenfile.csi.ephemera.dev"

// csiDriverName names the CSIDriver object in messages: this driver's, or in
// plugin mode that of the driver running the plugin.
var csiDriverName = "CSIDriver " + driverName

// Volume attributes of this driver (tmpfs's own, and "size", are accepted too).
const (
	paramAudience = "audience" // required
	paramFileName = "fileName" // default "token"
	paramFormat   = "format"   // "raw" (default) or "json"
)

// attributes are this driver's own volume attributes; the framework parses
// them once per publish and refuses a pod whose attributes do not parse, or
// that sets a key neither these nor tmpfs (or "size") accept.
var attributes = api.Attributes{
	api.StringAttr(paramAudience).Required().
		Describe("the audience of the token to mount (listed in the CSIDriver's spec.tokenRequests)"),
	api.PatternAttr(paramFileName, `[A-Za-z0-9_][A-Za-z0-9._-]{0,252}`).Default("token").
		Describe("a plain file name (letters, digits, '.', '_', '-'; not starting with '.')"),
	api.EnumAttr(paramFormat, "raw", "json").Default("raw"),
}

// Options returns the driver: a 1Mi tmpfs per volume holding one token file.
// main sets the Authorizer from --allowed-namespaces.
func Options() (framework.Options, error) {
	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 1 << 20})
	if err != nil {
		return framework.Options{}, err
	}
	return framework.Options{
		DriverName: driverName,
		Backends:   map[string]framework.Backend{"tmpfs": mem},
		Content:    framework.ContentFunc(tokenFile),
		Volumes:    framework.VolumeOptions{AcceptedAttributes: attributes},
	}, nil
}

// tokenFile is the volume's content, built at publish and on every republish.
// The token text must never be logged: api.Token and api.Tokens redact
// themselves, but a plain string does not.
func tokenFile(_ context.Context, v *api.Volume) (map[string]api.File, error) {
	audience := v.Attributes.String(paramAudience)
	tok, ok := v.Tokens[audience]
	if !ok {
		return nil, api.InvalidParamf("the kubelet sent no token for audience %q: %s must list audience %q in spec.tokenRequests", audience, csiDriverName, audience)
	}
	data := []byte(tok.Token)
	var err error
	if v.Attributes.String(paramFormat) == "json" {
		// Not json.Marshal(tok): api.Token marshals redacted, by design.
		data, err = json.Marshal(struct {
			Token               string    `json:"token"`
			ExpirationTimestamp time.Time `json:"expirationTimestamp"`
		}{tok.Token, tok.ExpirationTimestamp})
		if err != nil {
			return nil, err
		}
	}
	return map[string]api.File{v.Attributes.String(paramFileName): {Data: data}}, nil
}

// allowNamespaces admits pods of the listed namespaces (comma-separated);
// an empty list admits all.
func allowNamespaces(list string) framework.Authorizer {
	var allowed []string
	for _, ns := range strings.Split(list, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			allowed = append(allowed, ns)
		}
	}
	if len(allowed) == 0 {
		return nil
	}
	return framework.AuthorizerFunc(func(_ context.Context, v *api.Volume) error {
		if slices.Contains(allowed, v.Pod.Namespace) {
			return nil
		}
		return fmt.Errorf("%w: namespace %q is not in the %s driver's --allowed-namespaces", api.ErrPermissionDenied, v.Pod.Namespace, driverName)
	})
}

func main() {
	klog.InitFlags(nil)
	if len(os.Args) > 1 && os.Args[1] == "plugin" {
		// tokenfile plugin --endpoint=unix:///...: see plugin.go.
		if err := pluginMain(os.Args[2:]); err != nil {
			klog.ErrorS(err, "Plugin failed")
			klog.Flush()
			os.Exit(1)
		}
		return
	}
	opts, err := Options()
	if err != nil {
		klog.Fatal(err)
	}
	framework.BindFlags(flag.CommandLine, &opts)
	allowed := flag.String("allowed-namespaces", "", "comma-separated namespaces whose pods may use the driver (empty: all)")
	flag.Parse()
	opts.Volumes.Authorizer = allowNamespaces(*allowed)
	d, err := framework.New(opts)
	if err != nil {
		klog.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := d.Run(ctx); err != nil {
		klog.Fatal(err)
	}
}
