package framework

import (
	"context"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volstats"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// DescribeVolumes describes the volumes of recs on this node: for each
// Published record, whether its target under kubeletRoot is mounted and, for a
// volume with a filesystem of its own, that filesystem's usage. It reads the
// node through m (mount.New() for the real one) and changes nothing. The
// driver's GET /volumes uses it; so can a tool that read a stopped driver's
// state file (boltstore.Inspect).
func DescribeVolumes(recs []*store.Record, kubeletRoot string, m mount.Interface) []api.VolumeInfo {
	return volstats.Describe(recs, kubeletRoot, m)
}

// volumeList is what GET /volumes answers: the driver's records, described.
func (d *Driver) volumeList(ctx context.Context) (*api.VolumeList, error) {
	recs, err := d.Records(ctx)
	if err != nil {
		return nil, err
	}
	list := &api.VolumeList{
		Driver:  d.opts.DriverName,
		Node:    d.opts.Node.ID,
		Version: d.opts.Node.Version,
		Volumes: DescribeVolumes(recs, d.opts.Node.KubeletRootDir, d.engine.Mounter()),
	}
	d.engine.ProvisioningSince(list.Volumes) // long provisioning
	return list, nil
}
