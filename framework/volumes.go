package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// VolumeList is what a node holds: the body of the driver's GET /volumes (see
// [Driver.Handler]) and what [DescribeVolumes] builds from a state file.
type VolumeList struct {
	// Driver and Node are the driver's name and node ID; empty when the list
	// was read from a state file.
	Driver string `json:"driver,omitempty"`
	Node   string `json:"node,omitempty"`
	// Version is the driver's Options.Version; empty from a state file.
	Version string `json:"version,omitempty"`
	// Volumes are ordered by volume ID.
	Volumes []VolumeInfo `json:"volumes"`
}

// VolumeInfo is one volume of a [VolumeList]: what its record says, and its
// usage when it is mounted. It holds no attributes and no secrets.
type VolumeInfo struct {
	VolumeID   string  `json:"volumeID"`
	Pod        api.Pod `json:"pod"` // Namespace and Name are empty in a rebuilt record
	VolumeName string  `json:"volumeName,omitempty"`
	Backend    string  `json:"backend"`
	// Size is the volume's size in bytes; 0 when it has none (a dir volume).
	Size  int64       `json:"size,omitempty"`
	Phase store.Phase `json:"phase"`
	// Rebuilt marks a record rebuilt from the node (store.Record.Rebuilt).
	Rebuilt    bool      `json:"rebuilt,omitempty"`
	TargetPath string    `json:"targetPath,omitempty"`
	Created    time.Time `json:"created"`
	// Mounted says whether the target is a mount point (a link on Windows)
	// now; false for a volume that is not Published.
	Mounted bool `json:"mounted"`
	// Usage is the filesystem's usage (statfs of the target) of a mounted
	// volume with a filesystem of its own (tmpfs, loop, vhdx); nil otherwise,
	// and for dir volumes, whose statfs would be the host's (their usage needs
	// a walk: NodeGetVolumeStats does it).
	Usage *VolumeUsage `json:"usage,omitempty"`
	// Error says why Mounted or Usage could not be read; empty when they were.
	Error string `json:"error,omitempty"`
}

// VolumeUsage is a filesystem's usage in bytes and inodes.
type VolumeUsage struct {
	BytesTotal  int64 `json:"bytesTotal"`
	BytesUsed   int64 `json:"bytesUsed"`
	BytesAvail  int64 `json:"bytesAvailable"`
	InodesTotal int64 `json:"inodesTotal,omitempty"`
	InodesUsed  int64 `json:"inodesUsed,omitempty"`
}

// DescribeVolumes describes the volumes of recs on this node: for each
// Published record, whether its target under kubeletRoot is mounted and, for a
// volume with a filesystem of its own, that filesystem's usage. It reads the
// node through m (mount.New() for the real one) and changes nothing. The
// driver's GET /volumes uses it; so can a tool that read a stopped driver's
// state file (boltstore.Inspect).
func DescribeVolumes(recs []*store.Record, kubeletRoot string, m mount.Interface) []VolumeInfo {
	out := make([]VolumeInfo, 0, len(recs))
	for _, rec := range recs {
		v := VolumeInfo{
			VolumeID:   rec.VolumeID,
			Pod:        api.Pod{Namespace: rec.Pod.Namespace, Name: rec.Pod.Name, UID: rec.Pod.UID},
			VolumeName: rec.VolumeName,
			Backend:    rec.Backend,
			Size:       rec.Size,
			Phase:      rec.Phase,
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
func describeMount(v *VolumeInfo, rec *store.Record, kubeletRoot string, m mount.Interface) {
	mounted, err := m.IsMountPoint(kubeletRoot, rec.TargetPath)
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
	u, err := filesystemUsage(r, rec.TargetPath)
	if err != nil {
		if !errors.Is(err, mount.ErrNotSupported) {
			v.Error = fmt.Sprintf("reading usage: %v", err)
		}
		return
	}
	v.Usage = &VolumeUsage{
		BytesTotal: u.bytesTotal, BytesUsed: u.bytesUsed, BytesAvail: u.bytesAvail,
		InodesTotal: u.inodesTotal, InodesUsed: u.inodesUsed,
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
	list := VolumeList{
		Driver:  d.opts.DriverName,
		Node:    d.opts.NodeID,
		Version: d.opts.Version,
		Volumes: DescribeVolumes(recs, d.opts.KubeletRootDir, d.mounter),
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(list) // the client went away
}
