package lanes

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// Lanes are the node's bulkheads (DESIGN 4f): every node-wide resource that one
// party can exhaust is partitioned by that party, so that a backend or plugin
// that is up but never answers can hold only its own share.
//
//   - publish: NodePublishVolume calls in flight. Limits.MaxInFlight in all;
//     each backend has Limits.InFlightReservedPerBackend of them to itself and
//     holds at most Limits.MaxInFlightPerBackend. A publish that cannot get
//     its backend's share fails at once (ResourceExhausted, naming the backend
//     and the flag).
//   - teardown: NodeUnpublishVolume calls and the GC's removals, a lane
//     publishes cannot use. Each backend (and "no record", and backends no
//     longer configured) has Limits.MaxInFlightPerBackend slots of its own,
//     shared with no one: a creating plugin whose Delete hangs blocks only its
//     own teardowns.
//   - content: Volumes.ContentBytesInFlight, the bytes of content answers in
//     flight. Each content provider has one answer's bound (its
//     ContentLimits().MaxBytes) reserved, and borrows the rest up to half the
//     budget (all of it when it is the only provider); waiters are served
//     round-robin between providers.
//   - refresh: content refreshes in flight; Volumes.RefreshConcurrency per
//     content provider, one of them reserved.
//   - held: Volumes.ContentCapacity, the memory of the content written into
//     memory-backed volumes while they exist (internal/fill), by content
//     provider.
type Lanes struct {
	Locks     admission.Locks
	Publishes *admission.Pool
	Teardowns *admission.Pool
	Content   *Budget
	Refresh   *admission.Pool
	Held      *Held

	maxInFlight, reservedPerBackend int // Options', for the refusals' words
}

// NoRecord is the teardown party of an unpublish that finds no record.
const NoRecord = ""

// New builds the lanes of validated options.
func New(o Options) (*Lanes, error) {
	l := &Lanes{maxInFlight: o.MaxInFlight, reservedPerBackend: o.InFlightReservedPerBackend}
	names := o.Backends
	per, reserved := int64(o.MaxInFlightPerBackend), int64(o.InFlightReservedPerBackend)
	shares := make(map[string]admission.Share, len(names))
	for _, name := range names {
		shares[name] = admission.Share{Reserved: reserved, Max: per}
	}
	var err error
	if l.Publishes, err = admission.NewPool(int64(o.MaxInFlight), shares, nil); err != nil {
		return nil, err
	}
	// The teardown lane: every party's slots are its own. Backends no longer
	// configured (records of an older configuration) share per slots more.
	own := make(map[string]admission.Share, len(names)+1)
	for _, name := range append(slices.Clone(names), NoRecord) {
		own[name] = admission.Share{Reserved: per, Max: per}
	}
	if l.Teardowns, err = admission.NewPool(per*int64(len(own)+1), own, &admission.Share{Max: per}); err != nil {
		return nil, err
	}
	providers := o.ContentParties
	cshares := make(map[string]admission.Share, len(providers))
	rshares := make(map[string]admission.Share, len(providers))
	// One provider may use the whole budget; of several, each at most half
	// of it, so that the others have more than their reserves to share.
	half := o.ContentBytesInFlight
	if len(providers) > 1 {
		half /= 2
	}
	for party, bound := range providers {
		cshares[party] = admission.Share{Reserved: bound, Max: max(bound, half)}
		rshares[party] = admission.Share{Reserved: 1, Max: int64(o.RefreshConcurrency)}
	}
	pool, err := admission.NewPool(o.ContentBytesInFlight, cshares, &admission.Share{Max: half})
	if err != nil {
		return nil, err
	}
	l.Content = &Budget{size: o.ContentBytesInFlight, pool: pool}
	refreshTotal := max(int64(o.RefreshConcurrency), int64(len(providers)))
	if l.Refresh, err = admission.NewPool(refreshTotal, rshares, &admission.Share{Max: int64(o.RefreshConcurrency)}); err != nil {
		return nil, err
	}
	if l.Held, err = newHeld(o.ContentCapacity, o.HeldParties); err != nil {
		return nil, err
	}
	return l, nil
}

// Options size the lanes; package lifecycle computes them from its Config.
type Options struct {
	Backends                   []string // the configured backends, sorted
	MaxInFlight                int
	MaxInFlightPerBackend      int
	InFlightReservedPerBackend int
	ContentBytesInFlight       int64
	ContentParties             map[string]int64 // bounded content providers: their bound
	RefreshConcurrency         int
	ContentCapacity            int64    // NoContentCapacity: no bound
	HeldParties                []string // every content provider's party
}

// NoContentCapacity is Options.ContentCapacity without a bound.
const NoContentCapacity = -1

// Budget is Options.Volumes.ContentBytesInFlight: the bytes that content
// answers in flight may take, reserved in full before each bounded call, from
// the content provider's own share (lanes). A waiter whose context ends gets
// ResourceExhausted.
type Budget struct {
	size int64
	pool *admission.Pool
}

// Reserve waits for n bytes of party's share until ctx ends, and returns
// their release, which may be called more than once.
func (b *Budget) Reserve(ctx context.Context, party string, n int64) (release func(), err error) {
	n = min(max(n, 0), b.size)
	g, err := b.pool.Acquire(ctx, party, n)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil, err // the caller went away: nobody reads a message
		}
		var inUse int64
		u := b.pool.Usage()
		for _, x := range u {
			inUse += x.Held
		}
		return nil, errkind.Errorf(api.ErrResourceExhausted, "content answers in flight take this content provider's share of the driver's budget of %s (--content-bytes-in-flight, %s of it in use, %s by this provider); its volume needs %s of it: the kubelet retries",
			words.Bytes(b.size), words.Bytes(inUse), words.Bytes(u[party].Held), words.Bytes(n))
	}
	return g.Release, nil
}

// InUse returns the bytes reserved, for tests.
func (b *Budget) InUse() int64 {
	var n int64
	for _, u := range b.pool.Usage() {
		n += u.Held
	}
	return n
}

// Held is Volumes.ContentCapacity: the memory that the content the
// driver wrote into memory-backed volumes (tmpfs) may take for as long as
// they exist, where no pod cgroup pays for it (internal/fill's
// ChargeVolumeSize). The kernel charges those pages, and the inodes, to
// the memory cgroup of the process that wrote them, the driver's, and
// keeps them there as long as anything keeps them alive, after a restart
// of the driver in the same cgroup too: unbounded, a few pods would keep
// the driver OOM-killed. So the first write into such a volume reserves
// what its filesystem can hold (its size and inodes) before it writes
// (content.Options.Admit), a teardown releases, and a startup counts what
// the records of the volumes say (internal/fill's CountHeld) whatever the
// capacity says.
//
// The capacity is partitioned by content provider (DESIGN 4f), as the
// content budget is: with several providers, each has capacity/(2×providers)
// to itself and holds at most half of it.
type Held struct {
	size int64           // Volumes.ContentCapacity; NoContentCapacity: no bound
	pool *admission.Pool // nil without a bound

	mu   sync.Mutex
	vols map[string]heldVolume // volume ID → what its content holds
	held int64                 // the sum, also without a bound
}

type heldVolume struct {
	grants []*admission.Grant // none without a bound
	n      int64
}

// release gives back every grant of v.
func (v heldVolume) release() {
	for _, g := range v.grants {
		g.Release()
	}
}

// newHeld builds the accounting of capacity between the content parties.
func newHeld(capacity int64, providers []string) (*Held, error) {
	h := &Held{size: capacity, vols: map[string]heldVolume{}}
	if h.size == NoContentCapacity {
		return h, nil
	}
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

// Reserve admits n bytes of content of party's volume id, or says why not:
// ResourceExhausted while other volumes hold the capacity, InvalidArgument
// when n is more than party may ever hold; what says what takes the n
// bytes, in the refusal. The grant is nil without a bound.
func (h *Held) Reserve(id, party string, n int64, what string) (*admission.Grant, error) {
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
	if r.Never {
		return nil, errkind.Invalidf("%s, more than its content provider may ever hold of the driver's content capacity (%s of --content-capacity %s); retrying does not help: ask for a smaller volume (its \"size\"), or raise --content-capacity and the driver's memory limit with it",
			what, words.Bytes(r.Max), words.Bytes(h.size))
	}
	h.mu.Lock()
	held := h.held
	h.mu.Unlock()
	return nil, errkind.Errorf(api.ErrResourceExhausted, "%s; the content of this node's volumes already takes %s of the driver's content capacity (--content-capacity %s), %s of it this provider's (at most %s): the pod can start once other pods on this node end, and the kubelet retries",
		what, words.Bytes(held), words.Bytes(h.size), words.Bytes(r.Held), words.Bytes(r.Max))
}

// Set makes g (n bytes) what volume id's content holds, releasing what it
// held before.
func (h *Held) Set(id string, g *admission.Grant, n int64) {
	v := heldVolume{n: n}
	if g != nil {
		v.grants = []*admission.Grant{g}
	}
	h.mu.Lock()
	old := h.vols[id]
	h.vols[id] = v
	h.held += n - old.n
	h.mu.Unlock()
	old.release()
}

// Add counts g (n bytes) besides what volume id's content holds already: a
// write that failed may have left its files beside the old ones.
func (h *Held) Add(id string, g *admission.Grant, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.vols[id]
	if g != nil {
		v.grants = append(v.grants, g)
	}
	v.n += n
	h.vols[id] = v
	h.held += n
}

// Of returns what volume id's content is counted to hold: 0 when it is not
// counted.
func (h *Held) Of(id string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.vols[id].n
}

// Adopt counts n bytes as what volume id's content holds, whatever the
// capacity says: content that is there already.
func (h *Held) Adopt(id, party string, n int64) {
	var g *admission.Grant
	if h.pool != nil {
		g = h.pool.Force(party, n)
	}
	h.Set(id, g, n)
}

// Holds reports whether volume id's content is counted.
func (h *Held) Holds(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.vols[id]
	return ok
}

// Release stops counting volume id's content: the volume is gone.
func (h *Held) Release(id string) {
	h.mu.Lock()
	old, ok := h.vols[id]
	delete(h.vols, id)
	h.held -= old.n
	h.mu.Unlock()
	if ok {
		old.release()
	}
}

// InUse returns the bytes counted, for the metrics and tests.
func (h *Held) InUse() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

// Size is the content capacity (NoContentCapacity: no bound).
func (h *Held) Size() int64 { return h.size }

// InFlight returns the volume operations in flight, publishes and teardowns.
func (l *Lanes) InFlight() int {
	var n int64
	for _, p := range []*admission.Pool{l.Publishes, l.Teardowns} {
		for _, u := range p.Usage() {
			n += u.Held
		}
	}
	return int(n)
}
