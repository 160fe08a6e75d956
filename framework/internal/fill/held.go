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
// node hold in memory-backed filesystems into Config.Held: written by an
// earlier run, it is still charged to the memory cgroup that wrote it. It
// is counted whatever the capacity says, from what the records say
// (store.Record.ContentHeld, recorded when the driver wrote it), never from
// the files in the volumes, which the pods may write (DESIGN 4g: a file
// named like the driver's content, a sparse one, a rename). A record
// without it (of an earlier version, or rebuilt from the node) counts what
// the kernel says the volume's own tmpfs uses (statfs), at most the size
// the record gives it; the next write of its content replaces that with
// the driver's count. A volume whose filesystem cannot be read is logged and
// counted by its next write.
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
		var n int64
		if rec.ContentHeld != nil {
			n = *rec.ContentHeld
		} else if n, err = f.used(rec); err != nil {
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

// used is what the kernel says the memory-backed filesystem at rec's
// target uses, its inodes charged as content charges them, at most rec's
// size (the tmpfs's size=, which the kernel enforces; 0 when the record has
// none): 0 when it is not memory-backed (or not there).
func (f *Filler) used(rec *store.Record) (int64, error) {
	if rec.Size <= 0 {
		return 0, nil
	}
	r, err := f.cfg.Mounter.OpenTarget(f.cfg.KubeletRootDir, rec.TargetPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	defer r.Close()
	mem, bytes, inodes, err := stats.MemoryUsed(r)
	if err != nil || !mem {
		return 0, err
	}
	return min(bytes+inodes*content.InodeCharge, rec.Size), nil
}
