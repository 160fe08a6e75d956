package framework_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// listSpy is a backend whose List records that a reconcile ran.
type listSpy struct {
	framework.BackendFuncs
	listed atomic.Bool
}

func (l *listSpy) List(context.Context) ([]string, error) {
	l.listed.Store(true)
	return nil, nil
}

// A second driver process started on the endpoint of a running one (a second
// DaemonSet pod on the node, a process left running) must not take over the
// socket: it fails fast from Run with an error naming the endpoint, before it
// opens its state or reconciles, and the first stays reachable.
func TestSecondDriverOnSameEndpointFailsFast(t *testing.T) {
	sockDir, err := os.MkdirTemp("", "eph")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	endpoint := "unix://" + filepath.Join(sockDir, "csi.sock")
	opts := func() framework.Options {
		base := t.TempDir()
		return framework.Options{
			DriverName: "x.y",
			Backends:   map[string]framework.Backend{"x": &listSpy{}},
			Node: framework.NodeOptions{
				ID:             "n",
				Endpoint:       endpoint,
				StateDir:       filepath.Join(base, "state"),
				KubeletRootDir: filepath.Join(base, "kubelet"),
			},
			Volumes: framework.VolumeOptions{Mounter: mount.NewFake()},
			State:   framework.StateOptions{Store: memstore.New()}, // separate states: only the endpoint is shared
		}
	}
	first := drivertest.Start(t, opts())

	secondOpts := opts()
	spy := secondOpts.Backends["x"].(*listSpy)
	second, err := framework.New(secondOpts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- second.Run(ctx) }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("the second driver is serving the first one's endpoint")
	}
	if err == nil || !strings.Contains(err.Error(), endpoint) || !strings.Contains(err.Error(), "another driver process") {
		t.Fatalf("second Run = %v, want an error naming %s and saying another driver process serves it", err, endpoint)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("second Run took %s to fail", d)
	}
	if spy.listed.Load() {
		t.Error("the second driver reconciled before finding the endpoint taken")
	}

	// A new connection (not the harness's, which outlives a removed socket
	// file) reaches the first driver.
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer rcancel()
	id := csi.NewIdentityClient(conn)
	if p, err := id.Probe(rctx, &csi.ProbeRequest{}, grpc.WaitForReady(false)); err != nil || !p.GetReady().GetValue() {
		t.Fatalf("Probe of the first driver after the second exited: %v, %v", p, err)
	}
	if info, err := id.GetPluginInfo(rctx, &csi.GetPluginInfoRequest{}); err != nil || info.GetName() != "x.y" {
		t.Fatalf("GetPluginInfo of the first driver: %v, %v", info, err)
	}
	if !first.Driver().Ready() {
		t.Error("the first driver is no longer ready")
	}
}
