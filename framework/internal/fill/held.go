package fill

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

// Records is what CountHeld reads of the state store: every record.
type Records interface {
	List(ctx context.Context) ([]*store.Record, error)
}

// CountHeld counts, at startup, the content the volumes published on the
// node hold in memory-backed filesystems (content.Charged) into Config.Held:
// written by an earlier run, it is still charged to the memory cgroup that
// wrote it. It is counted whatever the capacity says; a volume whose content
// cannot be read is logged and counted by its next write.
func (f *Filler) CountHeld(ctx context.Context, records Records) {
	log := klog.FromContext(ctx)
	if !f.cfg.Providers.Any() {
		return
	}
	recs, err := records.List(ctx)
	if err != nil {
		log.Error(err, "Counting the content of published volumes")
		return
	}
	held := f.cfg.Held
	for _, rec := range recs {
		if rec.Phase != store.PhasePublished || f.cfg.Providers.For(rec.Backend) == nil {
			continue
		}
		n, err := f.charged(rec.TargetPath)
		if err != nil {
			log.Error(err, "Counting the content of a published volume", logkeys.VolumeID, rec.VolumeID)
			continue
		}
		if n > 0 {
			held.Adopt(rec.VolumeID, f.cfg.Providers.Party(rec.Backend), n)
		}
	}
	if n := held.InUse(); n > 0 {
		log.V(2).Info("Counted the content of published volumes in memory", logkeys.Size, words.Bytes(n), logkeys.Limit, words.Bytes(held.Size()))
	}
}

// charged is what the content at target holds in memory: 0 when its
// filesystem is not memory-backed.
func (f *Filler) charged(target string) (int64, error) {
	r, err := f.cfg.Mounter.OpenTarget(f.cfg.KubeletRootDir, target)
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
	return content.Charged(r, f.cfg.Held.Page())
}
