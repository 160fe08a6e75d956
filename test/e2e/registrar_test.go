//go:build e2e && linux

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSidecarStyleRegistration runs the driver without --register and a separate
// registrar process with node-driver-registrar's flags and behaviour
// (test/e2e/registrar): the real kubelet registers the driver through it and
// publishes an inline volume. Afterwards the driver is back to self-registration.
func TestSidecarStyleRegistration(t *testing.T) {
	c := clu
	d := requireDriver(t)
	ctx := context.Background()
	bin := filepath.Join(c.root, "bin", "registrar")
	if err := c.goBuild(ctx, bin, "./test/e2e/registrar"); err != nil {
		t.Fatal(err)
	}
	d.stop() // its embedded registrar removes its socket: the kubelet deregisters it
	regDir := filepath.Join(c.kubeletRoot, "plugins_registry")
	before := d.registrations()
	var err error
	if d.p, err = c.startProc(d.proc, d.bin, d.args(false), nil); err != nil {
		t.Fatal(err)
	}
	sidecar, err := c.startProc("registrar", bin, []string{
		"--csi-address=" + strings.TrimPrefix(d.endpoint, "unix://"),
		"--plugin-registration-path=" + regDir,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		sidecar.stop(10 * time.Second)
		d.stop()
		if err := d.start(ctx); err != nil {
			t.Fatalf("restarting the self-registering driver: %v", err)
		}
	}()
	if err := d.waitRegistered(ctx, before); err != nil {
		t.Fatalf("registration through the separate registrar: %v", err)
	}
	if _, err := os.Stat(filepath.Join(regDir, driverName+"-reg.sock")); err != nil {
		t.Fatalf("the registrar's socket: %v", err)
	}

	vol := tmpfsVolume("viasidecar", "8Mi")
	p := c.createPod(t, c.newPod("default", "sidecar-registered", vol, steps(st("write", "/data/f", "4096"), st("pause"))))
	defer c.deletePod(t, p, goneTimeout)
	p = c.waitRunning(t, p, runningTimeout)
	c.published(t, p, vol)
	wantStep(t, c.output(t, p, 1), 0, "write ok")
}
