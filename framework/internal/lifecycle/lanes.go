package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// lanes are the node's bulkheads (DESIGN 4f): every node-wide resource that one
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
//     memory-backed volumes while they exist (heldcontent.go), by content
//     provider.
type lanes struct {
	locks     admission.Locks
	publishes *admission.Pool
	teardowns *admission.Pool
	content   *budget
	refresh   *admission.Pool
	held      *heldContent
}

// noRecord is the teardown party of an unpublish that finds no record.
const noRecord = ""

// newLanes builds the pools from validated options.
func newLanes(o *Config) (*lanes, error) {
	l := &lanes{}
	names := backendNames(o.Backends)
	per, reserved := int64(o.Limits.MaxInFlightPerBackend), int64(o.Limits.InFlightReservedPerBackend)
	shares := make(map[string]admission.Share, len(names))
	for _, name := range names {
		shares[name] = admission.Share{Reserved: reserved, Max: per}
	}
	var err error
	if l.publishes, err = admission.NewPool(int64(o.Limits.MaxInFlight), shares, nil); err != nil {
		return nil, err
	}
	// The teardown lane: every party's slots are its own. Backends no longer
	// configured (records of an older configuration) share per slots more.
	own := make(map[string]admission.Share, len(names)+1)
	for _, name := range append(names, noRecord) {
		own[name] = admission.Share{Reserved: per, Max: per}
	}
	if l.teardowns, err = admission.NewPool(per*int64(len(own)+1), own, &admission.Share{Max: per}); err != nil {
		return nil, err
	}
	providers := contentParties(o)
	cshares := make(map[string]admission.Share, len(providers))
	rshares := make(map[string]admission.Share, len(providers))
	// One provider may use the whole budget; of several, each at most half
	// of it, so that the others have more than their reserves to share.
	half := o.Volumes.ContentBytesInFlight
	if len(providers) > 1 {
		half /= 2
	}
	for party, bound := range providers {
		cshares[party] = admission.Share{Reserved: bound, Max: max(bound, half)}
		rshares[party] = admission.Share{Reserved: 1, Max: int64(o.Volumes.RefreshConcurrency)}
	}
	pool, err := admission.NewPool(o.Volumes.ContentBytesInFlight, cshares, &admission.Share{Max: half})
	if err != nil {
		return nil, err
	}
	l.content = &budget{size: o.Volumes.ContentBytesInFlight, pool: pool}
	refreshTotal := max(int64(o.Volumes.RefreshConcurrency), int64(len(providers)))
	if l.refresh, err = admission.NewPool(refreshTotal, rshares, &admission.Share{Max: int64(o.Volumes.RefreshConcurrency)}); err != nil {
		return nil, err
	}
	if l.held, err = newHeldContent(o); err != nil {
		return nil, err
	}
	return l, nil
}

// contentParties returns each bounded content provider's party and bound:
// a backend that is its own ContentProvider is its own party (its name), the
// driver's Options.Content is party contentOption. Only bounded providers
// (ContentBounder) reserve from the budget. Static: a plugin's handshake is
// not known yet, so a plugin backend counts as a provider whatever it says
// later.
func contentParties(o *Config) map[string]int64 {
	parties := map[string]int64{}
	if cb, ok := o.Content.(ContentBounder); ok {
		parties[contentOption] = cb.ContentLimits().MaxBytes
	}
	for name, b := range o.Backends {
		if _, ok := b.Unwrap().(ContentProvider); !ok {
			continue
		}
		if cb, ok := b.Unwrap().(ContentBounder); ok {
			parties[name] = cb.ContentLimits().MaxBytes
		}
	}
	return parties
}

// contentOption is the content party of Options.Content: no backend name is
// empty.
const contentOption = ""

// contentParty returns the party whose share the content of backend's
// volumes is charged to.
func (d *Engine) contentParty(backend string) string {
	if b, ok := d.cfg.Backends[backend]; ok && b.ContentProvider() != nil {
		return backend
	}
	return contentOption
}

// beginPublish admits a publish of v: its backend's share of the publish lane
// (ResourceExhausted at once when taken), then the volume's lock (Aborted).
// The returned func releases both.
func (d *Engine) beginPublish(v *api.Volume) (func(), error) {
	g, err := d.lanes.publishes.TryAcquire(v.Backend, 1)
	if err != nil {
		return nil, d.laneRefused("publishes", v.Backend, err)
	}
	if !d.lanes.locks.TryAcquire(v.ID) {
		g.Release()
		return nil, errkind.Errorf(api.ErrBusy, "an operation for volume %s is already in progress", v.ID)
	}
	return func() {
		d.lanes.locks.Release(v.ID)
		g.Release()
	}, nil
}

// lockVolume takes id's lock (Aborted when another operation holds it).
func (d *Engine) lockVolume(id string) (func(), error) {
	if !d.lanes.locks.TryAcquire(id) {
		return nil, errkind.Errorf(api.ErrBusy, "an operation for volume %s is already in progress", id)
	}
	return func() { d.lanes.locks.Release(id) }, nil
}

// beginTeardown admits a teardown of a volume of backend (noRecord: the
// volume has no record) in the teardown lane, at once or not at all.
func (d *Engine) beginTeardown(backend string) (func(), error) {
	g, err := d.lanes.teardowns.TryAcquire(backend, 1)
	if err != nil {
		return nil, d.laneRefused("unpublishes", backend, err)
	}
	return g.Release, nil
}

// laneRefused is the ResourceExhausted of a lane that refused backend.
func (d *Engine) laneRefused(what, backend string, err error) error {
	var r *admission.Refusal
	if !errors.As(err, &r) {
		return errkind.Errorf(errkind.ErrInternal, "admitting the volume operation: %v", err)
	}
	name := "backend " + backend
	if backend == noRecord {
		name = "volumes without a record"
	}
	if r.Held >= r.Max {
		return errkind.Errorf(api.ErrResourceExhausted, "%d %s of %s are already in flight on this node, its share (--max-in-flight-per-backend %d); the kubelet retries",
			r.Held, what, name, r.Max)
	}
	return errkind.Errorf(api.ErrResourceExhausted, "%s has %d %s in flight and the node's other slots are taken by other backends (--max-in-flight %d, %d reserved per backend: --in-flight-reserved-per-backend); the kubelet retries",
		name, r.Held, what, d.cfg.Limits.MaxInFlight, d.cfg.Limits.InFlightReservedPerBackend)
}

// budget is Options.Volumes.ContentBytesInFlight: the bytes that content
// answers in flight may take, reserved in full before each bounded call, from
// the content provider's own share (lanes). A waiter whose context ends gets
// ResourceExhausted.
type budget struct {
	size int64
	pool *admission.Pool
}

// reserve waits for n bytes of party's share until ctx ends, and returns
// their release, which may be called more than once.
func (b *budget) reserve(ctx context.Context, party string, n int64) (release func(), err error) {
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

// inUse returns the bytes reserved, for tests.
func (b *budget) inUse() int64 {
	var n int64
	for _, u := range b.pool.Usage() {
		n += u.Held
	}
	return n
}

// CheckContentShares validates that the content budget holds one answer of
// every bounded content provider at once: each provider has its bound
// reserved, so that one that never answers cannot take the others' turn.
func CheckContentShares(o *Config) error {
	var sum int64
	parties := contentParties(o)
	for _, bound := range parties {
		if bound > math.MaxInt64-sum {
			sum = math.MaxInt64
			break
		}
		sum += bound
	}
	if len(parties) > 1 && sum > o.Volumes.ContentBytesInFlight {
		return fmt.Errorf("Volumes.ContentBytesInFlight %s (--content-bytes-in-flight) holds less than one answer of each of the %d content providers at once (%s, the sum of their bounds): each has its bound reserved, so that a provider that never answers cannot hold the others up; raise the budget (and the memory limit, about three times the budget) or lower the providers' bounds (a plugin's max-content-bytes)",
			words.Bytes(o.Volumes.ContentBytesInFlight), len(parties), words.Bytes(sum))
	}
	return nil
}

// inFlight returns the volume operations in flight, publishes and teardowns,
// for the metrics.
func (d *Engine) inFlight() int {
	var n int64
	for _, p := range []*admission.Pool{d.lanes.publishes, d.lanes.teardowns} {
		for _, u := range p.Usage() {
			n += u.Held
		}
	}
	return int(n)
}
