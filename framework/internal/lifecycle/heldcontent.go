package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// heldContent is Volumes.ContentCapacity: the memory that the content the
// driver wrote into memory-backed volumes (tmpfs) takes for as long as they
// exist. The kernel charges those pages, and the inodes, to the memory
// cgroup of the process that wrote them, the driver's, and keeps them there
// after a restart of the driver in the same cgroup: unbounded, a few pods
// with large content would keep the driver OOM-killed. So each write
// reserves content.Charge of its files before it writes (content.Options.Admit),
// a replacement holds both sets until the old one is gone, a teardown
// releases, and a startup counts what the volumes already hold
// (content.Charged) whatever the capacity says.
//
// The capacity is partitioned by content provider (DESIGN 4f), as the
// content budget is: with several providers, each has capacity/(2×providers)
// to itself and holds at most half of it.
type heldContent struct {
	size int64 // Volumes.ContentCapacity; NoContentCapacity: no bound
	page int64
	pool *admission.Pool // nil without a bound

	mu   sync.Mutex
	vols map[string]heldVolume // volume ID → what its content holds
	held int64                 // the sum, also without a bound
}

type heldVolume struct {
	grant *admission.Grant // nil without a bound
	n     int64
}

// newHeldContent builds the accounting from validated options.
func newHeldContent(o *Config) (*heldContent, error) {
	h := &heldContent{size: o.Volumes.ContentCapacity, page: int64(os.Getpagesize()), vols: map[string]heldVolume{}}
	if h.size == NoContentCapacity {
		return h, nil
	}
	providers := ContentProviders(o)
	shares := make(map[string]admission.Share, len(providers))
	other := admission.Share{Max: h.size}
	if len(providers) > 1 {
		other.Max = h.size / 2
		for _, p := range providers {
			shares[p] = admission.Share{Reserved: h.size / int64(2*len(providers)), Max: h.size / 2}
		}
	}
	var err error
	h.pool, err = admission.NewPool(h.size, shares, &other)
	return h, err
}

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

// reserve admits n bytes of content of party's volume id, or says why not:
// ResourceExhausted while other volumes hold the capacity, InvalidArgument
// when n is more than party may ever hold. The grant is nil without a bound.
func (h *heldContent) reserve(id, party string, n int64, files int) (*admission.Grant, error) {
	if h.pool == nil {
		return nil, nil
	}
	g, err := h.pool.TryAcquire(party, n)
	if err == nil {
		return g, nil
	}
	var r *admission.Refusal
	if !errors.As(err, &r) {
		return nil, errkind.Errorf(errkind.ErrInternal, "admitting the content of volume %s: %v", id, err)
	}
	what := fmt.Sprintf("the content of volume %s takes %s of node memory in its tmpfs (%d files: data in whole pages, and %s per file, directory and link)", id, words.Bytes(n), files, words.Bytes(content.InodeCharge))
	if r.Never {
		return nil, errkind.Invalidf("%s, more than its content provider may ever hold of the driver's content capacity (%s of --content-capacity %s); retrying does not help: make the content smaller, or raise --content-capacity and the driver's memory limit with it",
			what, words.Bytes(r.Max), words.Bytes(h.size))
	}
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	return nil, errkind.Errorf(api.ErrResourceExhausted, "%s; the content of this node's volumes already takes %s of the driver's content capacity (--content-capacity %s), %s of it this provider's (at most %s): the pod can start once other pods on this node end, and the kubelet retries",
		what, words.Bytes(held), words.Bytes(h.size), words.Bytes(r.Held), words.Bytes(r.Max))
}

// set makes g (n bytes) what volume id's content holds, releasing what it
// held before.
func (h *heldContent) set(id string, g *admission.Grant, n int64) {
	h.mu.Lock()
	old := h.vols[id]
	h.vols[id] = heldVolume{grant: g, n: n}
	h.held += n - old.n
	h.mu.Unlock()
	old.grant.Release()
}

// adopt counts n bytes as what volume id's content holds, whatever the
// capacity says: content that is there already.
func (h *heldContent) adopt(id, party string, n int64) {
	var g *admission.Grant
	if h.pool != nil {
		g = h.pool.Force(party, n)
	}
	h.set(id, g, n)
}

// holds reports whether volume id's content is counted.
func (h *heldContent) holds(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.vols[id]
	return ok
}

// release stops counting volume id's content: the volume is gone.
func (h *heldContent) release(id string) {
	h.mu.Lock()
	old, ok := h.vols[id]
	delete(h.vols, id)
	h.held -= old.n
	h.mu.Unlock()
	if ok {
		old.grant.Release()
	}
}

// inUse returns the bytes counted, for the metrics and tests.
func (h *heldContent) inUse() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
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
	held := d.lanes.held
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
			held.adopt(rec.VolumeID, d.contentParty(rec.Backend), n)
		}
	}
	if n := held.inUse(); n > 0 {
		log.V(2).Info("Counted the content of published volumes in memory", logkeys.Size, words.Bytes(n), logkeys.Limit, words.Bytes(held.size))
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
	return content.Charged(r, d.lanes.held.page)
}
