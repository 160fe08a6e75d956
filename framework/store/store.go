package store

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/ephemera-csi/ephemera/api"
)

// RecordVersion is the schema version written into every record. A store refuses
// records of a newer version than it knows (a downgrade) instead of misreading them.
const RecordVersion = 1

// Phase is where a volume is in its lifecycle.
type Phase string

const (
	// PhasePublishing is the durable intent written before the first side effect of
	// a first publish when the backend's storage could not be found on the node
	// after a crash, and the record of what a failed rollback left. A record left
	// in this phase is rolled back.
	PhasePublishing Phase = "Publishing"
	// PhasePublished is written after the volume is mounted and populated; only
	// then does the driver answer OK.
	PhasePublished Phase = "Published"
	// PhaseUnpublishing is the intent earlier versions wrote before a teardown
	// (an unpublish now needs none: its record stays Published until deleted
	// last). A record left in this phase is rolled back.
	PhaseUnpublishing Phase = "Unpublishing"
	// PhaseUnclaimed marks storage the startup reconcile found without a record
	// and without a pod on this node to own it (no target, no vol_data.json),
	// when it could not prove the storage a leftover. It is kept, counted and
	// reported, never deleted by the driver on its own: a publish of that volume
	// claims it, and an operator can release it.
	PhaseUnclaimed Phase = "Unclaimed"
)

// ErrNotFound is returned by Get for an unknown volume ID.
var ErrNotFound = errors.New("volume record not found")

// ErrVersion is returned for a record written by a newer schema version.
var ErrVersion = errors.New("volume record has a newer schema version than this driver understands")

// ErrUndecodable is returned for a stored record that cannot be decoded (damaged
// bytes, or a record stored under another volume's ID). boltstore moves such
// records aside when it opens a file, so a store only returns it for damage that
// appeared while it was open; reopening the store quarantines the record.
var ErrUndecodable = errors.New("volume record cannot be decoded")

// Record is everything the driver promised about one volume. It never contains
// secrets.
type Record struct {
	Version    int     `json:"version"`
	VolumeID   string  `json:"volumeID"`
	VolumeName string  `json:"volumeName"`
	TargetPath string  `json:"targetPath"`
	Pod        api.Pod `json:"pod"`
	Backend    string  `json:"backend"`
	// Params are the user's attributes (kubelet keys removed).
	Params map[string]string `json:"params,omitempty"`
	// Hash identifies the request that created the volume (attributes, readOnly,
	// fsType, fsGroup, backend); a publish with another hash is AlreadyExists.
	Hash     string            `json:"hash"`
	Size     int64             `json:"size,omitempty"`
	FSType   string            `json:"fsType,omitempty"`
	ReadOnly bool              `json:"readOnly,omitempty"`
	FSGroup  *int64            `json:"fsGroup,omitempty"`
	Source   *api.Source       `json:"source,omitempty"`
	State    map[string]string `json:"state,omitempty"`
	Phase    Phase             `json:"phase"`
	// Rebuilt marks a record the driver rebuilt from the node (the mount table,
	// the kubelet's vol_data.json, a backend's inventory) because its own was
	// lost or damaged. Such a record lacks what only the request carried: Hash,
	// Params, the pod's name, namespace and service account, ReadOnly, FSType,
	// FSGroup, and for a directory volume Size. The next NodePublishVolume of
	// the volume completes it from the request and clears the mark.
	Rebuilt bool `json:"rebuilt,omitempty"`
	// ContentHeld is the node memory the content the driver wrote into the
	// volume may take, charged to the driver (in bytes): where no pod cgroup
	// pays for it (the volume-size fallback), what the volume's tmpfs can
	// hold, reserved before its first write; 0 where the pod's cgroup pays,
	// or for content on a disk. Recorded when the driver writes, so that a
	// restarted driver counts it against Volumes.ContentCapacity without
	// reading the volume, which the pod may write. nil when not recorded (a
	// volume without content, a record of an earlier version or rebuilt
	// from the node). Added in schema version 1 without a new version: an
	// earlier driver ignores it.
	ContentHeld *int64    `json:"contentHeld,omitempty"`
	Created     time.Time `json:"created"`
	Updated     time.Time `json:"updated"`
}

// Clone returns a deep copy of r: nothing of it is shared with r (a nil map,
// slice or pointer stays nil). Stores hand out and keep clones, so that a
// caller's later changes to a record never reach what the store holds.
func (r *Record) Clone() *Record {
	c := *r
	c.Params = maps.Clone(r.Params)
	c.State = maps.Clone(r.State)
	if r.FSGroup != nil {
		g := *r.FSGroup
		c.FSGroup = &g
	}
	if r.Source != nil {
		src := r.Source.Clone()
		c.Source = &src
	}
	if r.ContentHeld != nil {
		n := *r.ContentHeld
		c.ContentHeld = &n
	}
	return &c
}

// Identifier is implemented by stores with an identity: a random ID created
// with the store's file, so a lost, reset or rebuilt state file has a new one.
// The framework stamps backends' storage areas with it (see framework.Stamper).
type Identifier interface {
	ID() string
}

// Relaxed is implemented by stores that can commit a write without waiting for
// the disk. A relaxed write is visible at once and survives a crash of the
// process (it is in the kernel's page cache, as a kill -9 leaves it); it reaches
// the disk with the next durable write or within the store's sync interval
// (boltstore: RelaxedSyncInterval). A power loss or kernel crash in between may
// lose it, or leave a file the store must rebuild (boltstore detects that at
// open). The framework uses it only for volumes that a power loss takes
// anyway and the node shows after a crash: those of framework.MountOnly
// backends (tmpfs), whose records it can rebuild from the mount table.
type Relaxed interface {
	// PutRelaxed is Put without waiting for the disk.
	PutRelaxed(ctx context.Context, r *Record) error
	// DeleteRelaxed is Delete without waiting for the disk.
	DeleteRelaxed(ctx context.Context, id string) error
}

// Store persists records. Put is durable when it returns (bbolt fsyncs); concurrent
// Puts may be batched into one transaction.
type Store interface {
	// Get returns the record for id, or an error wrapping ErrNotFound.
	Get(ctx context.Context, id string) (*Record, error)
	// Put creates or replaces r (keyed by r.VolumeID), setting r.Version.
	Put(ctx context.Context, r *Record) error
	// Delete removes the record for id; nil when it does not exist.
	Delete(ctx context.Context, id string) error
	// List returns every record, ordered by volume ID.
	List(ctx context.Context) ([]*Record, error)
	// Close releases the store; later calls fail.
	Close() error
}
