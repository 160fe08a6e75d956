package lifecycle

import (
	"context"
	"errors"
	"io/fs"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// ContentProviders returns the content party (contentParty) of every
// provider, bounded or not.
func ContentProviders(o *Config) []string {
	var ps []string
	if o.Content != nil {
		ps = append(ps, contentOption)
	}
	for _, name := range backendNames(o.Backends) {
		if _, ok := o.Backends[name].Unwrap().(ContentProvider); ok {
			ps = append(ps, name)
		}
	}
	return ps
}

// countHeldContent counts, at startup, the content the volumes published on
// the node hold in memory-backed filesystems (content.Charged): written by
// an earlier run, it is still charged to the memory cgroup that wrote it.
// It is counted whatever the capacity says; a volume whose content cannot
// be read is logged and counted by its next write.
func (d *Engine) countHeldContent(ctx context.Context) {
	log := klog.FromContext(ctx)
	if !d.anyContent() {
		return
	}
	recs, err := d.store.List(ctx)
	if err != nil {
		log.Error(err, "Counting the content of published volumes")
		return
	}
	held := d.lanes.Held
	for _, rec := range recs {
		if rec.Phase != store.PhasePublished || d.contentFor(rec.Backend) == nil {
			continue
		}
		n, err := d.chargedContent(rec.TargetPath)
		if err != nil {
			log.Error(err, "Counting the content of a published volume", logkeys.VolumeID, rec.VolumeID)
			continue
		}
		if n > 0 {
			held.Adopt(rec.VolumeID, d.contentParty(rec.Backend), n)
		}
	}
	if n := held.InUse(); n > 0 {
		log.V(2).Info("Counted the content of published volumes in memory", logkeys.Size, words.Bytes(n), logkeys.Limit, words.Bytes(held.Size()))
	}
}

// chargedContent is what the content at target holds in memory: 0 when its
// filesystem is not memory-backed.
func (d *Engine) chargedContent(target string) (int64, error) {
	r, err := d.mounter.OpenTarget(d.cfg.Node.KubeletRootDir, target)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	defer r.Close()
	if mem, err := stats.MemoryBacked(r); err != nil || !mem {
		return 0, err
	}
	return content.Charged(r, d.lanes.Held.Page())
}
