package volstats

import (
	"errors"
	"fmt"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Describe is framework.DescribeVolumes (which documents it): recs as
// api.VolumeInfo, with the mount and usage of each published one.
func Describe(recs []*store.Record, kubeletRoot string, m mount.Interface) []api.VolumeInfo {
	out := make([]api.VolumeInfo, 0, len(recs))
	for _, rec := range recs {
		v := api.VolumeInfo{
			VolumeID:   rec.VolumeID,
			Pod:        api.Pod{Namespace: rec.Pod.Namespace, Name: rec.Pod.Name, UID: rec.Pod.UID},
			VolumeName: rec.VolumeName,
			Backend:    rec.Backend,
			Size:       rec.Size,
			Phase:      string(rec.Phase),
			Rebuilt:    rec.Rebuilt,
			TargetPath: rec.TargetPath,
			Created:    rec.Created,
		}
		if rec.Phase == store.PhasePublished && rec.TargetPath != "" {
			describeMount(&v, rec, kubeletRoot, m)
		}
		out = append(out, v)
	}
	return out
}

// describeMount fills v.Mounted and v.Usage.
func describeMount(v *api.VolumeInfo, rec *store.Record, kubeletRoot string, m mount.Interface) {
	mounted, err := mount.IsMountPointNow(m, kubeletRoot, rec.TargetPath)
	if err != nil {
		v.Error = fmt.Sprintf("checking the target: %v", err)
		return
	}
	v.Mounted = mounted
	if !mounted || rec.Source == nil || rec.Source.IsDir() {
		return
	}
	r, err := m.OpenTarget(kubeletRoot, rec.TargetPath)
	if err != nil {
		v.Error = fmt.Sprintf("opening the target: %v", err)
		return
	}
	defer r.Close()
	u, err := stats.Filesystem(r, rec.TargetPath)
	if err != nil {
		if !errors.Is(err, mount.ErrNotSupported) {
			v.Error = fmt.Sprintf("reading usage: %v", err)
		}
		return
	}
	v.Usage = &api.VolumeUsage{
		BytesTotal: u.BytesTotal, BytesUsed: u.BytesUsed, BytesAvail: u.BytesAvail,
		InodesTotal: u.InodesTotal, InodesUsed: u.InodesUsed,
	}
}
