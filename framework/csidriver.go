package framework

import (
	"context"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/csidriver"
)

// CSIDriverGetter reads the driver's CSIDriver object (Options.Observability.CSIDrivers).
// kube.Client is one.
type CSIDriverGetter interface {
	// GetCSIDriver returns the CSIDriver object called name, or an error
	// wrapping api.ErrNotFound when there is none.
	GetCSIDriver(ctx context.Context, name string) (*api.CSIDriver, error)
}

// CSIDriverEventSink is implemented by an Options.Observability.Events that can also post
// events about the driver's CSIDriver object (events.Recorder does): the
// startup check of the object posts its findings there.
type CSIDriverEventSink interface {
	CSIDriverEvent(obj api.CSIDriver, eventType, reason, message string)
}

// ReasonCSIDriverMisconfigured (Warning, about the CSIDriver object): the
// startup check found the driver's CSIDriver object missing or set in a way
// that breaks its pods; the message says what to change.
const ReasonCSIDriverMisconfigured = "CSIDriverMisconfigured"

// The checks of the CSIDriver object, as the check label of the
// ephemera_csidriver_misconfigured metric names them.
const (
	CheckCSIDriverExists         = "exists"
	CheckCSIDriverEphemeral      = "volumeLifecycleModes"
	CheckCSIDriverPodInfoOnMount = "podInfoOnMount"
	CheckCSIDriverFSGroupPolicy  = "fsGroupPolicy"
	CheckCSIDriverAttachRequired = "attachRequired"
)

// CSIDriverProblem is one way a CSIDriver object does not fit the driver.
type CSIDriverProblem struct {
	// Check is one of the CheckCSIDriver constants.
	Check string
	// Message says what is wrong and what to change.
	Message string
}

// CheckCSIDriver compares the driver's CSIDriver object with what the
// framework needs of it; obj nil means that there is none. It returns the
// problems found, none for a fitting object.
func CheckCSIDriver(name string, obj *api.CSIDriver) []CSIDriverProblem {
	var ps []CSIDriverProblem
	for _, p := range csidriver.Check(name, obj) {
		ps = append(ps, CSIDriverProblem(p))
	}
	return ps
}

// csiDriverCheck is the startup check of the CSIDriver object: after a
// random delay of up to Options.Observability.CSIDriverCheckJitter (longer
// for a large fleet: Options.Observability.FleetSize) it reads
// it through Options.Observability.CSIDrivers (retrying transient errors
// with jittered backoff for up to a minute), logs each problem as an error
// with what to fix, exports ephemera_csidriver_misconfigured for every check
// and posts the problems as one Warning event on the object. It never stops
// the driver: a publish that the object breaks fails with its own message
// anyway.
func (d *Driver) csiDriverCheck() *csidriver.Startup {
	s := &csidriver.Startup{
		Name:      d.opts.DriverName,
		Jitter:    d.opts.Observability.CSIDriverCheckJitter,
		FleetSize: d.opts.Observability.FleetSize,
		Get:       d.opts.Observability.CSIDrivers.GetCSIDriver,
		Observe:   d.metrics.CSIDriverChecked,
	}
	if sink, ok := d.opts.Observability.Events.(CSIDriverEventSink); ok {
		s.Event = func(obj api.CSIDriver, message string) {
			sink.CSIDriverEvent(obj, EventTypeWarning, ReasonCSIDriverMisconfigured, message)
		}
	}
	return s
}
