package volstats

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// LegacyVolumeCondition is the node capability VOLUME_CONDITION (value 4) of
// CSI spec 1.3-1.12, which kubelets up to at least 1.34 still use (behind the
// CSIVolumeHealth feature gate). CSI 1.13 replaced it with GET_VOLUME_HEALTH and
// removed the enum value and the volume_condition field from the generated code;
// both are still valid on the wire.
const LegacyVolumeCondition csi.NodeServiceCapability_RPC_Type = 4

// HealthChecker is framework.HealthChecker.
type HealthChecker interface {
	Check(ctx context.Context, v *api.Volume) error
}

// Reader answers the stats and health calls.
type Reader struct {
	// Store is the driver's state (set once it is open).
	Store func() store.Store
	// Mounter and KubeletRootDir reach the targets.
	Mounter        mount.Interface
	KubeletRootDir string
	// Windows selects the Windows rules for comparing target paths
	// (framework's isWindows).
	Windows bool
	// Walks are the walks of directory volumes, shared with the lifecycle,
	// which drops a volume's at its unpublish.
	Walks *stats.Cache
	// HealthChecker is the named backend's HealthChecker, nil when none.
	HealthChecker func(backend string) HealthChecker
	// Volume is the backend's view of a record (declared attributes parsed).
	Volume func(rec *store.Record) *api.Volume
}

// health is the outcome of a volume's health check.
type health struct {
	status  csi.VolumeHealthErrorType // UNKNOWN_VOLUME_HEALTH_TYPE when healthy
	reason  string
	message string
}

func (h health) ok() bool { return h.reason == "" }

// lookup finds the record of a published volume for the stats and health RPCs.
// Missing arguments are InvalidArgument; an unknown ID is NotFound, and so is a
// path other than the volume's target (when one is given).
func (d *Reader) lookup(ctx context.Context, id, path string, pathRequired bool) (*store.Record, error) {
	if id == "" {
		return nil, errkind.Invalidf("volume_id is required")
	}
	if path == "" && pathRequired {
		return nil, errkind.Invalidf("volume_path is required")
	}
	rec, err := d.Store().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errkind.Errorf(api.ErrNotFound, "volume %s is not published on this node", id)
	}
	if err != nil {
		return nil, errkind.Transient(fmt.Errorf("reading volume state: %w", err))
	}
	if path != "" && !volume.SameTarget(path, rec.TargetPath, d.Windows) {
		return nil, errkind.Errorf(api.ErrNotFound, "volume %s is published at %s, not at %s", rec.VolumeID, rec.TargetPath, path)
	}
	return rec, nil
}

// check reports whether a published volume is usable: its record complete, its
// target mounted, and its backend's storage intact.
func (d *Reader) check(ctx context.Context, rec *store.Record) (health, error) {
	if rec.Phase != store.PhasePublished {
		return health{csi.VolumeHealthErrorType_INACCESSIBLE, "OperationInProgress", fmt.Sprintf("volume is in phase %s", rec.Phase)}, nil
	}
	mounted, err := mount.IsMountPointNow(d.Mounter, d.KubeletRootDir, rec.TargetPath)
	if err != nil {
		return health{}, errkind.Transient(fmt.Errorf("checking target: %w", err))
	}
	if !mounted {
		return health{csi.VolumeHealthErrorType_INACCESSIBLE, "NotMounted", "volume is not mounted at its target; the next NodePublishVolume repairs it"}, nil
	}
	if hc := d.HealthChecker(rec.Backend); hc != nil {
		if err := hc.Check(ctx, d.Volume(rec)); err != nil {
			return health{csi.VolumeHealthErrorType_INACCESSIBLE, "BackendUnhealthy", fmt.Sprintf("backend %s: %v", rec.Backend, err)}, nil
		}
	}
	return health{}, nil
}

// VolumeStats answers NodeGetVolumeStats. The kubelet calls it with the
// volume handle and the target path of a mounted volume. It takes no volume lock:
// stats never delay or abort a publish. The volume is looked up first, so an
// unknown ID is NotFound whatever the path.
func (d *Reader) VolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	rec, err := d.lookup(ctx, req.GetVolumeId(), req.GetVolumePath(), true)
	if err != nil {
		return nil, err
	}
	h, err := d.check(ctx, rec)
	if err != nil {
		return nil, err
	}
	resp := &csi.NodeGetVolumeStatsResponse{}
	if h.ok() {
		var u stats.Usage
		r, err := d.Mounter.OpenTarget(d.KubeletRootDir, rec.TargetPath)
		if err == nil {
			u, err = stats.Filesystem(r, rec.TargetPath)
			r.Close()
		}
		if err == nil && rec.Source != nil && rec.Source.IsDir() && !stats.OwnFilesystem(rec.TargetPath) {
			u, err = d.directoryUsage(ctx, rec, u)
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err() // the caller went away: Canceled or DeadlineExceeded
		case errors.Is(err, mount.ErrNotSupported):
			return nil, errkind.Errorf(errkind.ErrUnimplemented, "volume stats: %w", err)
		case err != nil:
			h = health{csi.VolumeHealthErrorType_INACCESSIBLE, "StatFailed", fmt.Sprintf("reading usage: %v", err)}
		default:
			resp.Usage = []*csi.VolumeUsage{
				{Unit: csi.VolumeUsage_BYTES, Total: u.BytesTotal, Available: u.BytesAvail, Used: u.BytesUsed},
				{Unit: csi.VolumeUsage_INODES, Total: u.InodesTotal, Available: u.InodesFree, Used: u.InodesUsed},
			}
		}
	}
	setLegacyCondition(resp, !h.ok(), h.message)
	return resp, nil
}

// directoryUsage completes u, the figures of the filesystem that holds the
// directory volume of rec, with the directory's own usage: a walk of it,
// shared by concurrent calls and reused for StatsWalk.CacheTTL, bounded by
// Options.Limits.StatsWalk. A walk stopped by a bound gives what it counted, a lower
// bound. It returns ctx's error as soon as ctx ends; the walk then goes on
// for the other callers, if any, within its own bounds.
func (d *Reader) directoryUsage(ctx context.Context, rec *store.Record, u stats.Usage) (stats.Usage, error) {
	key := stats.Key{Target: rec.TargetPath, Created: rec.Created}
	w, err := d.Walks.Usage(ctx, rec.VolumeID, key, func(ctx context.Context, lim stats.Limits, visited func(context.Context, int64)) (stats.Result, error) {
		r, err := d.Mounter.OpenTarget(d.KubeletRootDir, key.Target)
		if err != nil {
			return stats.Result{}, err
		}
		defer r.Close()
		return stats.Walk(ctx, r, key.Target, lim, visited)
	})
	if err != nil {
		return stats.Usage{}, err
	}
	u.BytesUsed, u.InodesUsed = w.Bytes, w.Inodes
	return u, nil
}

// setLegacyCondition adds volume_condition (field 2: {bool abnormal = 1;
// string message = 2;}) as the kubelet's CSI 1.12 bindings expect it.
func setLegacyCondition(resp *csi.NodeGetVolumeStatsResponse, abnormal bool, msg string) {
	if msg == "" {
		msg = "volume is healthy"
	}
	var cond []byte
	if abnormal {
		cond = protowire.AppendTag(cond, 1, protowire.VarintType)
		cond = protowire.AppendVarint(cond, 1)
	}
	cond = protowire.AppendTag(cond, 2, protowire.BytesType)
	cond = protowire.AppendString(cond, msg)
	raw := protowire.AppendTag(nil, 2, protowire.BytesType)
	raw = protowire.AppendBytes(raw, cond)
	resp.ProtoReflect().SetUnknown(raw)
}

// VolumeHealth answers NodeGetVolumeHealth (CSI 1.13 GET_VOLUME_HEALTH).
func (d *Reader) VolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	rec, err := d.lookup(ctx, req.GetVolumeId(), req.GetVolumePublishPath(), false)
	if err != nil {
		return nil, err
	}
	h, err := d.check(ctx, rec)
	if err != nil {
		return nil, err
	}
	vh := &csi.VolumeHealth{VolumeId: rec.VolumeID}
	if !h.ok() {
		vh.HealthStatuses = []*csi.VolumeHealth_VolumeHealthEntry{{Status: h.status, Reason: h.reason, Message: h.message}}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: vh}, nil
}
