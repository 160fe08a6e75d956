// Command hello is the smallest useful Ephemera driver: every pod that mounts it
// gets a read-only-friendly tmpfs volume holding the pod's own identity.
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
)

// Options returns the driver: a 1Mi tmpfs per volume, filled by podIdentity.
func Options() (framework.Options, error) {
	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 1 << 20})
	if err != nil {
		return framework.Options{}, err
	}
	return framework.Options{
		DriverName: "hello.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"tmpfs": mem},
		Content:    framework.ContentFunc(podIdentity),
	}, nil
}

func podIdentity(_ context.Context, v *api.Volume) (map[string]api.File, error) {
	return map[string]api.File{
		"namespace":      {Data: []byte(v.Pod.Namespace)},
		"name":           {Data: []byte(v.Pod.Name)},
		"uid":            {Data: []byte(v.Pod.UID)},
		"serviceaccount": {Data: []byte(v.Pod.ServiceAccount)},
	}, nil
}

func main() {
	klog.InitFlags(nil)
	opts, err := Options()
	if err != nil {
		klog.Fatal(err)
	}
	framework.BindFlags(flag.CommandLine, &opts)
	flag.Parse()
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
