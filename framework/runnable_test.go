package framework_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// Runnables run while the driver serves and are stopped and waited for when
// it stops; one that fails early does not stop the driver.
func TestRunnables(t *testing.T) {
	var running, stopped atomic.Int32
	started := make(chan struct{})
	long := framework.RunnableFunc(func(ctx context.Context) error {
		running.Add(1)
		close(started)
		<-ctx.Done()
		stopped.Add(1)
		return nil
	})
	failing := framework.RunnableFunc(func(context.Context) error { return errors.New("informer failed") })
	h := drivertest.Start(t, framework.Options{
		Backends:  map[string]framework.Backend{"b": framework.BackendFuncs{}},
		Runnables: []framework.Runnable{long, failing},
		Volumes:   framework.VolumeOptions{Mounter: mount.NewFake()},
		State:     framework.StateOptions{Store: memstore.New()},
	})
	<-started
	if _, err := h.Identity.Probe(t.Context(), nil); err != nil {
		t.Fatalf("driver not serving beside a failed runnable: %v", err)
	}
	h.Stop()
	if running.Load() != 1 || stopped.Load() != 1 {
		t.Errorf("runnable started %d, stopped %d times; want 1, 1", running.Load(), stopped.Load())
	}
}
