package storage

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Backend is what Storage uses of a backend: Create and Delete, and whether
// it lists, finds or only mounts its storage (the optional interfaces of
// framework.Backend, nil or false when it does not implement them now).
type Backend interface {
	Create(ctx context.Context, v *api.Volume) (api.Source, error)
	Delete(ctx context.Context, v *api.Volume) error
	Lister() Lister
	Finder() Finder
	MountOnly() bool
}

// Lister and Finder have the method sets of framework's (which document
// them).
type (
	Lister interface {
		List(ctx context.Context) (volumeIDs []string, err error)
	}
	Finder interface {
		Find(ctx context.Context, v *api.Volume) (api.Source, error)
	}
)

// MountTable is what Storage reads of the mounts: where a source is mounted.
type MountTable interface {
	MountedAt(src api.Source) ([]string, error)
}

// Storage calls the backends and writes the records. Set the store
// (SetStore) and the metrics (SetMetrics) before the first call.
type Storage struct {
	kubeletRoot string
	windows     bool
	mounts      MountTable
	store       store.Store
	metrics     *metrics.Metrics
}

// New returns the Storage of a driver whose kubelet root dir is kubeletRoot;
// windows selects the Windows rules for target paths.
func New(kubeletRoot string, windows bool, mounts MountTable) *Storage {
	return &Storage{kubeletRoot: kubeletRoot, windows: windows, mounts: mounts}
}

// SetStore sets the state store the records go to.
func (s *Storage) SetStore(st store.Store) { s.store = st }

// SetMetrics sets the metrics the backend calls are timed into.
func (s *Storage) SetMetrics(m *metrics.Metrics) { s.metrics = m }

// Create is Backend.Create, timed.
func (s *Storage) Create(ctx context.Context, b Backend, v *api.Volume) (api.Source, error) {
	start := time.Now()
	src, err := b.Create(ctx, v)
	s.metrics.ObserveBackend(v.Backend, metrics.OpCreate, err, time.Since(start))
	return src, err
}

// Delete is Backend.Delete, timed.
func (s *Storage) Delete(ctx context.Context, b Backend, v *api.Volume) error {
	start := time.Now()
	err := b.Delete(ctx, v)
	s.metrics.ObserveBackend(v.Backend, metrics.OpDelete, err, time.Since(start))
	return err
}

// List is Lister.List of backend, timed.
func (s *Storage) List(ctx context.Context, backend string, l Lister) ([]string, error) {
	start := time.Now()
	ids, err := l.List(ctx)
	s.metrics.ObserveBackend(backend, metrics.OpList, err, time.Since(start))
	return ids, err
}

// StoreID returns the state store's identity, "" for a store without one.
func (s *Storage) StoreID() string {
	if id, ok := s.store.(store.Identifier); ok {
		return id.ID()
	}
	return ""
}

// Find asks a Finder backend which source v's existing storage is mounted
// from. found is false when the backend has none (or cannot tell).
func (s *Storage) Find(ctx context.Context, b Backend, v *api.Volume) (src api.Source, found bool, err error) {
	f := b.Finder()
	if f == nil {
		return api.Source{}, false, nil
	}
	src, err = f.Find(ctx, v)
	switch {
	case err == nil:
		return src, true, nil
	case errors.Is(err, api.ErrNotFound):
		return api.Source{}, false, nil
	default:
		return api.Source{}, false, fmt.Errorf("backend %s: finding the storage of volume %s: %w", v.Backend, v.ID, err)
	}
}

// RefuseIfMounted fails with ErrBusy (Aborted: the kubelet retries) when the
// mount table shows v's storage mounted anywhere: deleting it would take data
// from whoever uses that mount. The source checked is what the backend finds
// now (a Finder), else the one recorded at publish.
func (s *Storage) RefuseIfMounted(ctx context.Context, b Backend, v *api.Volume, recorded *api.Source) error {
	src, found, err := s.Find(ctx, b, v)
	if err != nil {
		return errkind.Transient(err)
	}
	if b.Finder() == nil && recorded != nil {
		src, found = *recorded, true
	}
	if !found {
		return nil
	}
	all, err := s.mounts.MountedAt(src)
	if err != nil {
		return errkind.Transient(fmt.Errorf("checking whether the storage of volume %s is mounted: %w", v.ID, err))
	}
	var where []string
	for _, p := range all {
		// A backend may publish one source for several volumes (a shared
		// directory); another volume's target showing it does not pin it.
		if !s.otherVolumesTarget(p, v.ID) {
			where = append(where, p)
		}
	}
	if len(where) > 0 {
		sort.Strings(where)
		return fmt.Errorf("%w: the storage of volume %s is still mounted at %s; it is not deleted while mounted (unmount it, or wait for the pod using it to end)",
			api.ErrBusy, v.ID, strings.Join(where, ", "))
	}
	return nil
}

// otherVolumesTarget reports whether p (a mount point as the mount table
// shows it) is the target of an inline volume other than id.
func (s *Storage) otherVolumesTarget(p, id string) bool {
	for _, root := range []string{s.kubeletRoot, s.realRoot()} {
		if t, err := volume.ParseTarget(root, p, s.windows); err == nil {
			return t.Handle() != id
		}
	}
	return false
}

// realRoot is the kubelet root with symbolic links resolved, as the mount
// table shows paths below it.
func (s *Storage) realRoot() string {
	if r, err := filepath.EvalSymlinks(s.kubeletRoot); err == nil {
		return r
	}
	return s.kubeletRoot
}

// NeedsIntent reports whether the first publish of a volume of b writes its
// record before creating anything. It need not when the node itself shows
// everything a crash can leave behind: b recognises its storage by source
// (Finder) and either lists it (Lister) or has none outside the mount
// (MountOnly), and a mount at the target is adopted from the mount table; the
// kubelet's vol_data.json, written before it calls NodePublishVolume and
// removed only after a successful NodeUnpublishVolume, names the pod. The
// startup reconcile then rebuilds the record (the node inventory,
// internal/lifecycle's Reconcile) and the kubelet's retry finishes the
// publish (the republish of a rebuilt record), or the storage goes with its
// pod. One durable commit less per publish.
func NeedsIntent(b Backend) bool {
	if b.Finder() == nil {
		return true
	}
	lists, mountOnly := b.Lister() != nil, b.MountOnly()
	return !lists && !mountOnly
}

// Relaxed reports whether the records of backend b are written without
// waiting for the disk (store.Relaxed): its volumes are nothing but their
// mounts (MountOnly, with a Finder). A power loss takes such a volume anyway,
// and after a crash of the driver its record is in the page cache, or
// rebuilt from the mount table (NeedsIntent). The fdatasync a durable commit
// waits for was the largest single cost of a tmpfs publish and unpublish
// (docs/design.md, "Durability").
func Relaxed(b Backend) bool {
	finds, mountOnly := b.Finder() != nil, b.MountOnly()
	return finds && mountOnly
}

// PutRecord saves rec of a volume of backend b: relaxed when b allows it and
// the store can, durably otherwise.
func (s *Storage) PutRecord(ctx context.Context, b Backend, rec *store.Record) error {
	return s.PutRecordRelaxed(ctx, Relaxed(b), rec)
}

// PutRecordRelaxed saves rec, relaxed when relax and the store can.
func (s *Storage) PutRecordRelaxed(ctx context.Context, relax bool, rec *store.Record) error {
	if rs, ok := s.store.(store.Relaxed); ok && relax {
		return rs.PutRelaxed(ctx, rec)
	}
	return s.store.Put(ctx, rec)
}

// DeleteRecord deletes the record id of a volume of backend b (nil when the
// driver no longer has it), as PutRecord saves it.
func (s *Storage) DeleteRecord(ctx context.Context, b Backend, id string) error {
	if rs, ok := s.store.(store.Relaxed); ok && b != nil && Relaxed(b) {
		return rs.DeleteRelaxed(ctx, id)
	}
	return s.store.Delete(ctx, id)
}
