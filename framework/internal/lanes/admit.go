package lanes

import (
	"errors"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
)

// This file holds the admissions of the lifecycle's operations to the lanes,
// and the words a refusal is answered in.

// BeginPublish admits a publish of volume id of backend: the backend's share
// of the publish lane (ResourceExhausted at once when taken), then the
// volume's lock (Aborted). The returned func releases both.
func (l *Lanes) BeginPublish(backend, id string) (func(), error) {
	g, err := l.Publishes.TryAcquire(backend, 1)
	if err != nil {
		return nil, l.refused("publishes", backend, err)
	}
	if !l.Locks.TryAcquire(id) {
		g.Release()
		return nil, busy(id)
	}
	return func() {
		l.Locks.Release(id)
		g.Release()
	}, nil
}

// LockVolume takes id's lock (Aborted when another operation holds it).
func (l *Lanes) LockVolume(id string) (func(), error) {
	if !l.Locks.TryAcquire(id) {
		return nil, busy(id)
	}
	return func() { l.Locks.Release(id) }, nil
}

// BeginTeardown admits a teardown of a volume of backend (NoRecord: the
// volume has no record) in the teardown lane, at once or not at all.
func (l *Lanes) BeginTeardown(backend string) (func(), error) {
	g, err := l.Teardowns.TryAcquire(backend, 1)
	if err != nil {
		return nil, l.refused("unpublishes", backend, err)
	}
	return g.Release, nil
}

func busy(id string) error {
	return errkind.Errorf(api.ErrBusy, "an operation for volume %s is already in progress", id)
}

// refused is the ResourceExhausted of a lane that refused backend.
func (l *Lanes) refused(what, backend string, err error) error {
	var r *admission.Refusal
	if !errors.As(err, &r) {
		return errkind.Errorf(errkind.ErrInternal, "admitting the volume operation: %v", err)
	}
	name := "backend " + backend
	if backend == NoRecord {
		name = "volumes without a record"
	}
	if r.Held >= r.Max {
		return errkind.Errorf(api.ErrResourceExhausted, "%d %s of %s are already in flight on this node, its share (--max-in-flight-per-backend %d); the kubelet retries",
			r.Held, what, name, r.Max)
	}
	return errkind.Errorf(api.ErrResourceExhausted, "%s has %d %s in flight and the node's other slots are taken by other backends (--max-in-flight %d, %d reserved per backend: --in-flight-reserved-per-backend); the kubelet retries",
		name, r.Held, what, l.maxInFlight, l.reservedPerBackend)
}
