package framework

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// node is the driver's side of the CSI services (csiserver.Node): the
// lifecycle's event sources for the kubelet's volume requests, the stats
// and the driver's state.
type node struct{ d *Driver }

func (n node) Publish(ctx context.Context, p *csiserver.Publish) error {
	return n.d.engine.Publish(ctx, p.Volume, p.Params, p.Hash)
}

// Unpublish drops the volume's stats answer, and stops a walk of it in
// progress (whose open directories would make the unmount fail), before and
// after the unpublish: a volume published again under the same ID is walked
// afresh.
func (n node) Unpublish(ctx context.Context, id, target string) error {
	return n.d.engine.Unpublish(ctx, id, target)
}

func (n node) VolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	return n.d.volumes.VolumeStats(ctx, req)
}

func (n node) VolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	return n.d.volumes.VolumeHealth(ctx, req)
}

func (n node) Healthy(ctx context.Context) error { return n.d.healthy(ctx) }

func (n node) Ready() bool { return n.d.ready.Load() }

// healthy reports whether the state store answers.
func (d *Driver) healthy(ctx context.Context) error {
	st := d.engine.Store()
	if st == nil {
		return errors.New("state store is not open")
	}
	if _, err := st.Get(ctx, "\x00probe"); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("state store: %w", err)
	}
	return nil
}
