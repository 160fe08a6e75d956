// Command registrar plays the node-driver-registrar sidecar in the e2e tests
// (its image cannot be run here): a separate process that asks the driver for
// its name over the CSI socket (GetPluginInfo), then serves the kubelet plugin
// registration API on <plugin-registration-path>/<name>-reg.sock, advertising the
// driver's socket as the endpoint, like the sidecar's --csi-address,
// --kubelet-registration-path and --plugin-registration-path flags. It proves
// that a driver without --register works with a registrar in another process.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/registration"
)

func main() {
	csiAddress := flag.String("csi-address", "", "the driver's CSI socket path")
	kubeletPath := flag.String("kubelet-registration-path", "", "the socket path the kubelet dials (defaults to --csi-address)")
	regDir := flag.String("plugin-registration-path", "", "the kubelet's plugins_registry directory")
	flag.Parse()
	if *kubeletPath == "" {
		*kubeletPath = *csiAddress
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *csiAddress, *kubeletPath, *regDir); err != nil {
		klog.ErrorS(err, "registrar failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, csiAddress, kubeletPath, regDir string) error {
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(csiAddress, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	var name string
	for deadline := time.Now().Add(60 * time.Second); ; {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			name = info.GetName()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GetPluginInfo on %s: %w", csiAddress, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	klog.InfoS("Driver found", "name", name)
	reg, err := registration.New(registration.Options{
		DriverName:      name,
		Endpoint:        strings.TrimPrefix(kubeletPath, "unix://"),
		RegistrationDir: regDir,
	})
	if err != nil {
		return err
	}
	return reg.Run(ctx)
}
