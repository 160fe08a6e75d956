package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
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

// volumesTimeout bounds GET /volumes.
const volumesTimeout = 10 * time.Second

// serveVolumes serves GET /volumes: the driver's records, described.
func (d *Driver) serveVolumes(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), volumesTimeout)
	defer cancel()
	recs, err := d.Records(ctx)
	if err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	list := api.VolumeList{
		Driver:  d.opts.DriverName,
		Node:    d.opts.Node.ID,
		Version: d.opts.Node.Version,
		Volumes: DescribeVolumes(recs, d.opts.Node.KubeletRootDir, d.engine.Mounter()),
	}
	d.engine.ProvisioningSince(list.Volumes) // long provisioning
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(list) // the client went away
}
