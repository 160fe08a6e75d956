package reconcile

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// This file holds what keeps a volume alive when its record is missing: the
// state file was lost, reset or damaged, or restored from an older copy. The
// rules (docs/design.md, "State is a cache of the node"):
//
//   - the node is the truth for what exists: mounts at targets under the
//     kubelet root, the kubelet's vol_data.json beside each target, and the
//     backends' inventories; a volume found there without a record is adopted
//     with a rebuilt record, never deleted and never mounted over;
//   - storage without a record is deleted only when the backend's storage area
//     carries the store's own stamp (the store has known all of it all along)
//     and nothing mounts it; otherwise it is kept as unclaimed;
//   - no storage is deleted while the mount table shows it mounted anywhere.
//
// Node only finds; the lifecycle's reconcile event saves, adopts or deletes.

// Kind is the case of a volume the node shows without a record; the
// lifecycle's reconcile event has one case (cond) for each.
type Kind int

const (
	// FoundMounted: published at its target (vol_data.json names this driver).
	FoundMounted Kind = iota + 1
	// FoundPodded: backend storage whose pod has the volume (vol_data.json).
	FoundPodded
	// FoundProven: backend storage the stamp proves a leftover.
	FoundProven
	// FoundUnproven: backend storage, no pod, not provably a leftover.
	FoundUnproven
)

// Finding is a volume the node shows without a record, for the reconcile
// event: its case and what its transition works on.
type Finding struct {
	Kind Kind
	// Record is the rebuilt record, not saved yet.
	Record *store.Record
	// Mounted is what the target shows (FoundMounted only).
	Mounted *mount.Mounted
	// Log is the volume's logger.
	Log klog.Logger
}

// Mounts is what Node reads of the mount table and the targets, with the
// method sets of mount.Interface's (which document them).
type Mounts interface {
	Published(root string) ([]string, error)
	Inspect(root, target string) (*mount.Mounted, error)
	Shows(m *mount.Mounted, src api.Source) (bool, error)
	OpenTarget(root, target string) (*os.Root, error)
}

// Storage is what Node reads of the backends, by name, and of the state
// store: internal/storage's calls over the lifecycle's backends.
type Storage interface {
	// Find is the source v's existing storage in backend is mounted from;
	// found is false when it has none, cannot tell, or cannot find.
	Find(ctx context.Context, backend string, v *api.Volume) (src api.Source, found bool, err error)
	// List is backend's inventory, timed; lists is false, and nothing is
	// called, for a backend that cannot list (not a Lister now).
	List(ctx context.Context, backend string) (ids []string, lists bool, err error)
	// Stamper is backend's Stamper, nil when it has none now.
	Stamper(backend string) Stamper
	// StoreID is the state store's identity, "" for a store without one.
	StoreID() string
}

// Stamper has the method set of framework's (which documents it): the
// identity of the state store a backend's storage area carries.
type Stamper interface {
	Stamp(ctx context.Context) (string, error)
	SetStamp(ctx context.Context, id string) error
}

// NodeConfig configures a Node.
type NodeConfig struct {
	// KubeletRoot is the kubelet root directory, Driver the driver's name.
	KubeletRoot, Driver string
	// Windows selects the Windows rules for target paths.
	Windows bool
	// Backends are the names of the driver's backends, in the order they
	// are asked.
	Backends []string
	// Logger is Options.Observability.Logger; Node logs as "reconcile".
	Logger klog.Logger
	// Reconciled counts an outcome of the reconcile (metrics.Reconciled).
	Reconciled func(result string)
}

// Node is the startup reconcile's view of the node: what it shows without
// a record.
type Node struct {
	cfg     NodeConfig
	mounts  Mounts
	storage Storage
}

// NewNode returns the Node of cfg over mounts and st.
func NewNode(cfg NodeConfig, mounts Mounts, st Storage) *Node {
	return &Node{cfg: cfg, mounts: mounts, storage: st}
}

// kubelet is what the kubelet's directories say about this driver's volumes.
func (n *Node) kubelet() volume.Kubelet {
	return volume.Kubelet{Root: n.cfg.KubeletRoot, Driver: n.cfg.Driver, Windows: n.cfg.Windows, Open: n.mounts.OpenTarget}
}

// UnrecordedMounts finds every volume of this driver that is published at
// its target (the mount table, or links on Windows) but has no record in
// known: the state was lost while pods used the volumes. Each gets a rebuilt
// record (FoundMounted).
func (n *Node) UnrecordedMounts(ctx context.Context, known map[string]bool) ([]Finding, error) {
	log := n.cfg.Logger.WithName("reconcile")
	root := n.cfg.KubeletRoot
	targets, err := n.mounts.Published(root)
	if err != nil {
		return nil, fmt.Errorf("listing published targets: %w", err)
	}
	var found []Finding
	for _, t := range targets {
		// Known volumes first, without reading their vol_data.json: at startup
		// on a full node nearly every target is.
		if pt, err := volume.ParseTarget(root, t, n.cfg.Windows); err != nil || known[pt.Handle()] {
			continue
		}
		pt, id, ok := n.kubelet().Owned(t)
		if !ok || known[id] {
			continue
		}
		vlog := log.WithValues(logkeys.VolumeID, id, logkeys.TargetPath, t)
		mt, err := n.mounts.Inspect(root, t)
		if err != nil || mt == nil {
			continue
		}
		rec := &store.Record{
			VolumeID: id, VolumeName: pt.VolumeName, TargetPath: t,
			Pod:   api.Pod{UID: pt.PodUID},
			Phase: store.PhasePublished, Rebuilt: true, ReadOnly: mt.ReadOnly,
			Created: time.Now().UTC(), Updated: time.Now().UTC(),
		}
		for _, name := range n.cfg.Backends {
			v := &api.Volume{ID: id, Name: pt.VolumeName, TargetPath: t, Backend: name, Pod: rec.Pod}
			src, found, err := n.storage.Find(ctx, name, v)
			if err != nil || !found {
				continue
			}
			if ok, err := n.mounts.Shows(mt, src); err == nil && ok {
				rec.Backend, rec.Source = name, &src
				if src.FSType == "tmpfs" {
					rec.Source = &api.Source{Path: src.Path, FSType: src.FSType}
				}
				break
			}
		}
		if rec.Source != nil && !rec.Source.IsDir() {
			if r, err := n.mounts.OpenTarget(root, t); err == nil {
				if u, err := stats.Filesystem(r, t); err == nil {
					rec.Size = u.BytesTotal
				}
				r.Close()
			}
		}
		found = append(found, Finding{Kind: FoundMounted, Record: rec, Mounted: mt, Log: vlog})
	}
	return found, nil
}

// Inventory is what UnrecordedStorage found in one backend's inventory.
type Inventory struct {
	// Backend is the backend's name.
	Backend string
	// Found is its storage without a record.
	Found []Finding
	// Failed holds the errors of the storage that could not be told apart,
	// kept.
	Failed []error
	// stamp is set when the storage area may be stamped with the store's
	// identity once every finding has its transition done (StampArea).
	stamp bool
}

// UnrecordedStorage compares one backend's inventory with the records in
// known. Storage whose pod still has the volume on this node (its
// vol_data.json, read through index) is FoundPodded. Other storage without
// a record is FoundProven only when the backend's stamp proves the store
// has known the area all along; otherwise it is FoundUnproven.
func (n *Node) UnrecordedStorage(ctx context.Context, name string, known map[string]bool, index func() (map[string]string, error)) *Inventory {
	inv := &Inventory{Backend: name}
	log := n.cfg.Logger.WithName("reconcile").WithValues(logkeys.Backend, name)
	ids, lists, err := n.storage.List(ctx, name)
	if !lists {
		return inv
	}
	if err != nil {
		log.Error(err, "Listing backend inventory")
		n.cfg.Reconciled(metrics.ReconcileFailed)
		inv.Failed = []error{err}
		return inv
	}
	storeID := n.storage.StoreID()
	stamper := n.storage.Stamper(name)
	isStamper := stamper != nil
	proven := false
	if isStamper && storeID != "" {
		st, err := stamper.Stamp(ctx)
		if err != nil {
			log.Error(err, "Reading the storage stamp; storage without a record is kept")
		}
		proven = err == nil && st == storeID
	}
	inv.stamp = isStamper && storeID != "" && !proven
	seen := map[string]bool{}
	for _, id := range ids {
		if known[id] || seen[id] {
			continue
		}
		seen[id] = true
		vlog := log.WithValues(logkeys.VolumeID, id)
		idx, err := index()
		if err != nil {
			vlog.Error(err, "Reading the kubelet's volumes; storage without a record is kept")
			inv.Failed = append(inv.Failed, err)
			continue
		}
		if t, ok := idx[id]; ok {
			pt, _ := volume.ParseTarget(n.cfg.KubeletRoot, t, n.cfg.Windows)
			rec := rebuiltRecord(id, name, store.PhasePublished)
			rec.VolumeName, rec.TargetPath, rec.Pod = pt.VolumeName, t, api.Pod{UID: pt.PodUID}
			inv.Found = append(inv.Found, Finding{Kind: FoundPodded, Record: rec, Log: vlog})
			continue
		}
		if proven {
			inv.Found = append(inv.Found, Finding{Kind: FoundProven, Record: rebuiltRecord(id, name, ""), Log: vlog})
			continue
		}
		rec := rebuiltRecord(id, name, store.PhaseUnclaimed)
		inv.Found = append(inv.Found, Finding{Kind: FoundUnproven, Record: rec, Log: vlog})
	}
	return inv
}

// StampArea stamps a backend's storage area with the state store's identity
// once every piece of its storage has a record: call it when every finding
// of inv had its transition done.
func (n *Node) StampArea(ctx context.Context, inv *Inventory) {
	if !inv.stamp {
		return
	}
	log := n.cfg.Logger.WithName("reconcile").WithValues(logkeys.Backend, inv.Backend)
	stamper := n.storage.Stamper(inv.Backend)
	storeID := n.storage.StoreID()
	if err := stamper.SetStamp(ctx, storeID); err != nil {
		log.Error(err, "Stamping the storage area with the state store's identity; storage without a record stays protected")
	} else {
		log.Info("Stamped the storage area with the state store's identity", logkeys.Store, storeID)
	}
}

// VolDataIndexOnce is the kubelet's index of this driver's volumes by
// handle (volume.Kubelet.Index), read at most once per reconcile.
func (n *Node) VolDataIndexOnce() func() (map[string]string, error) {
	return sync.OnceValues(n.kubelet().Index)
}

// rebuiltRecord is the record of storage found without one.
func rebuiltRecord(id, backend string, phase store.Phase) *store.Record {
	now := time.Now().UTC()
	return &store.Record{VolumeID: id, Backend: backend, Phase: phase, Rebuilt: true, Created: now, Updated: now}
}
