package lifecycle

import (
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
)

// laneOptions sizes the lanes of a validated cfg.
func laneOptions(o *Config) lanes.Options {
	return lanes.Options{
		Backends:                   backendNames(o.Backends),
		MaxInFlight:                o.Limits.MaxInFlight,
		MaxInFlightPerBackend:      o.Limits.MaxInFlightPerBackend,
		InFlightReservedPerBackend: o.Limits.InFlightReservedPerBackend,
		ContentBytesInFlight:       o.Volumes.ContentBytesInFlight,
		ContentParties:             o.providers().Bounds(),
		RefreshConcurrency:         o.Volumes.RefreshConcurrency,
		ContentCapacity:            o.Volumes.ContentCapacity,
		HeldParties:                o.providers().Parties(),
	}
}

// inFlight returns the volume operations in flight, publishes and teardowns,
// for the metrics.
func (d *Engine) inFlight() int { return d.lanes.InFlight() }
