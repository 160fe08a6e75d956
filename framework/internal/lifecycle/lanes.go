package lifecycle

import (
	"fmt"
	"math"

	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// laneOptions sizes the lanes of a validated cfg.
func laneOptions(o *Config) lanes.Options {
	return lanes.Options{
		Backends:                   backendNames(o.Backends),
		MaxInFlight:                o.Limits.MaxInFlight,
		MaxInFlightPerBackend:      o.Limits.MaxInFlightPerBackend,
		InFlightReservedPerBackend: o.Limits.InFlightReservedPerBackend,
		ContentBytesInFlight:       o.Volumes.ContentBytesInFlight,
		ContentParties:             contentParties(o),
		RefreshConcurrency:         o.Volumes.RefreshConcurrency,
		ContentCapacity:            o.Volumes.ContentCapacity,
		HeldParties:                ContentProviders(o),
	}
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
func (d *Engine) inFlight() int { return d.lanes.InFlight() }
