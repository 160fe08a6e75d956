// Command slowplugin is a test-only Ephemera plugin whose Create takes
// --delay before it answers (a tmpfs volume of the driver's, as the tmpfs
// backend describes it), and declares long provisioning
// (CAPABILITY_LONG_PROVISIONING): the e2e scenario TestLongProvisioning
// publishes a volume past the kubelet's 2 minute deadline through it. Create
// honours its context: an unpublish, or the driver's shutdown, cancels it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// slow delays the tmpfs backend's Create.
type slow struct {
	*tmpfs.Backend
	delay time.Duration
}

// LongProvisioning declares that Create may outlive the kubelet's call.
func (slow) LongProvisioning() {}

var _ framework.LongProvisioner = slow{}

func (s slow) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	log := klog.FromContext(ctx).WithValues("volumeID", v.ID)
	log.Info("Create: provisioning", "delay", s.delay)
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		log.Info("Create: cancelled", "err", ctx.Err())
		return api.Source{}, ctx.Err()
	}
	log.Info("Create: done")
	return s.Backend.Create(ctx, v)
}

func main() {
	endpoint := flag.String("endpoint", "", "the plugin's socket, unix://PATH")
	delay := flag.Duration("delay", 3*time.Minute, "how long Create takes")
	klog.InitFlags(nil)
	flag.Parse()
	mem, err := tmpfs.New(tmpfs.Options{})
	if err == nil {
		var s *pluginserver.Server
		s, err = pluginserver.New(pluginserver.Options{Name: "slow", Version: "e2e", Endpoint: *endpoint, Backend: slow{mem, *delay}})
		if err == nil {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			err = s.Run(klog.NewContext(ctx, klog.Background()))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "slowplugin:", err)
		os.Exit(1)
	}
}
