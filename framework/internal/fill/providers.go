package fill

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// ContentProvider and ContentBounder have the method sets of framework's
// (which document them).
type (
	ContentProvider interface {
		Content(ctx context.Context, v *api.Volume) (map[string]api.File, error)
	}
	ContentBounder interface {
		ContentProvider
		ContentLimits() content.Limits
	}
)

// Backend is what Providers uses of a backend: its content provider now (nil
// when it is none now; a plugin's handshake decides) and the author's
// backend, whose static type decides the lanes' parties before any
// handshake.
type Backend interface {
	ContentProvider() ContentProvider
	Unwrap() any
}

// Providers are the content providers of a driver: Options.Content and the
// backends that are their own. Each provider's answers are charged to its
// party's share of the lanes: a backend that is its own ContentProvider is
// its own party (its name), Options.Content is party contentOption.
type Providers struct {
	Content  ContentProvider // Options.Content; nil: none
	Backends map[string]Backend
}

// contentOption is the content party of Options.Content: no backend name is
// empty.
const contentOption = ""

// For returns what fills the volumes of the named backend: the backend
// itself when it is a ContentProvider (a plugin that provides content),
// otherwise Options.Content; nil when neither.
func (p Providers) For(backend string) ContentProvider {
	if b, ok := p.Backends[backend]; ok {
		if cp := b.ContentProvider(); cp != nil {
			return cp
		}
	}
	return p.Content
}

// Party returns the party whose share the content of backend's volumes is
// charged to.
func (p Providers) Party(backend string) string {
	if b, ok := p.Backends[backend]; ok && b.ContentProvider() != nil {
		return backend
	}
	return contentOption
}

// Any reports whether any volume of this driver may have content:
// Options.Content is set or a backend's type is a ContentProvider.
func (p Providers) Any() bool {
	if p.Content != nil {
		return true
	}
	for _, b := range p.Backends {
		if _, ok := b.Unwrap().(ContentProvider); ok {
			return true
		}
	}
	return false
}

// Parties returns the party of every provider, bounded or not (the lanes'
// HeldParties).
func (p Providers) Parties() []string {
	var ps []string
	if p.Content != nil {
		ps = append(ps, contentOption)
	}
	for _, name := range slices.Sorted(maps.Keys(p.Backends)) {
		if _, ok := p.Backends[name].Unwrap().(ContentProvider); ok {
			ps = append(ps, name)
		}
	}
	return ps
}

// Bounds returns each bounded content provider's party and bound (the lanes'
// ContentParties). Only bounded providers (ContentBounder) reserve from the
// budget. Static: a plugin's handshake is not known yet, so a plugin backend
// counts as a provider whatever it says later.
func (p Providers) Bounds() map[string]int64 {
	parties := map[string]int64{}
	if cb, ok := p.Content.(ContentBounder); ok {
		parties[contentOption] = cb.ContentLimits().MaxBytes
	}
	for name, b := range p.Backends {
		if _, ok := b.Unwrap().(ContentProvider); !ok {
			continue
		}
		if cb, ok := b.Unwrap().(ContentBounder); ok {
			parties[name] = cb.ContentLimits().MaxBytes
		}
	}
	return parties
}

// CheckShares validates that the content budget (Volumes.ContentBytesInFlight)
// holds one answer of every bounded content provider at once: each provider
// has its bound reserved, so that one that never answers cannot take the
// others' turn.
func (p Providers) CheckShares(budget int64) error {
	var sum int64
	parties := p.Bounds()
	for _, bound := range parties {
		if bound > math.MaxInt64-sum {
			sum = math.MaxInt64
			break
		}
		sum += bound
	}
	if len(parties) > 1 && sum > budget {
		return fmt.Errorf("Volumes.ContentBytesInFlight %s (--content-bytes-in-flight) holds less than one answer of each of the %d content providers at once (%s, the sum of their bounds): each has its bound reserved, so that a provider that never answers cannot hold the others up; raise the budget (and the memory limit, about three times the budget) or lower the providers' bounds (a plugin's max-content-bytes)",
			words.Bytes(budget), len(parties), words.Bytes(sum))
	}
	return nil
}
