package registration_test

import (
	"context"
	"os"
	"os/signal"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/registration"
)

// Register a driver with the kubelet once its CSI server is serving, and exit
// non-zero if the kubelet rejects it so that the driver is restarted.
func Example() {
	// In the framework this is the context of Driver.Run.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) //nolint:forbidigo // main owns the root context
	defer stop()

	reg, err := registration.New(registration.Options{
		DriverName:      "ephemera.csi.example.com",
		Endpoint:        "/var/lib/kubelet/plugins/ephemera.csi.example.com/csi.sock",
		RegistrationDir: "/var/lib/kubelet/plugins_registry",
	})
	if err != nil {
		klog.Background().Error(err, "Invalid registration options")
		return
	}

	// ... start the CSI gRPC server first, so that NodeGetInfo works ...

	if err := reg.Run(ctx); err != nil {
		// errors.Is(err, registration.ErrRegistrationFailed) when the kubelet
		// rejected the driver, for example because NodeGetInfo failed.
		klog.Background().Error(err, "Kubelet plugin registration failed")
		stop()
		os.Exit(1) // restart the driver, as node-driver-registrar does
	}
}
