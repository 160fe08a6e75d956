package fill

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

// provider is a content provider of the tests: files, or err.
type provider struct {
	files map[string]api.File
	err   error
	calls int
}

func (p *provider) Content(context.Context, *api.Volume) (map[string]api.File, error) {
	p.calls++
	return p.files, p.err
}

// bounded is a provider whose answers are bounded at max bytes.
type bounded struct {
	provider
	max int64
}

func (b *bounded) ContentLimits() content.Limits { return content.Limits{MaxBytes: b.max} }

// backend is a Backend of the tests: x is the author's backend, cp the
// content provider it is now (nil: none, as a plugin whose handshake said
// no).
type backend struct {
	x  any
	cp ContentProvider
}

func (b backend) ContentProvider() ContentProvider { return b.cp }
func (b backend) Unwrap() any                      { return b.x }

// A backend that is a content provider now fills its own volumes and is its
// own party; every other backend's volumes get Options.Content, charged to
// its party. What a backend's type is decides the lanes' parties (Parties,
// Bounds, Any) before any handshake.
func TestProviders(t *testing.T) {
	opt := &provider{}
	own := &bounded{max: 10}
	saidNo := &bounded{max: 20} // a plugin whose handshake said it provides no content
	p := Providers{Content: opt, Backends: map[string]Backend{
		"own":    backend{x: own, cp: own},
		"plain":  backend{x: struct{}{}},
		"saidNo": backend{x: saidNo},
	}}
	for _, tc := range []struct {
		backend string
		want    ContentProvider
		party   string
	}{
		{"own", own, "own"},
		{"plain", opt, contentOption},
		{"saidNo", opt, contentOption},
		{"retired", opt, contentOption}, // a record's backend the driver no longer has
	} {
		if got := p.For(tc.backend); got != tc.want {
			t.Errorf("For(%s) = %v, want %v", tc.backend, got, tc.want)
		}
		if got := p.Party(tc.backend); got != tc.party {
			t.Errorf("Party(%s) = %q, want %q", tc.backend, got, tc.party)
		}
	}
	if got, want := p.Parties(), []string{contentOption, "own", "saidNo"}; !slices.Equal(got, want) {
		t.Errorf("Parties() = %q, want %q", got, want)
	}
	if got := p.Bounds(); len(got) != 2 || got["own"] != 10 || got["saidNo"] != 20 {
		t.Errorf("Bounds() = %v, want own 10, saidNo 20 (Options.Content is unbounded)", got)
	}
	if !p.Any() {
		t.Error("Any() = false with providers")
	}

	none := Providers{Backends: map[string]Backend{"plain": backend{x: struct{}{}}}}
	if none.Any() || none.Parties() != nil || len(none.Bounds()) != 0 || none.For("plain") != nil {
		t.Errorf("without providers: Any %v, Parties %q, Bounds %v, For %v", none.Any(), none.Parties(), none.Bounds(), none.For("plain"))
	}
	onlyType := Providers{Backends: map[string]Backend{"plugin": backend{x: &provider{}}}}
	if !onlyType.Any() {
		t.Error("Any() = false for a backend whose type is a ContentProvider")
	}
}

// The content budget must hold one answer of every bounded provider at
// once; a single provider is never refused (its bound is checked against the
// budget on its own).
func TestCheckShares(t *testing.T) {
	two := Providers{Content: &bounded{max: 3 << 20}, Backends: map[string]Backend{"b": backend{x: &bounded{max: 2 << 20}}}}
	if err := two.CheckShares(5 << 20); err != nil {
		t.Errorf("bounds summing to the budget: %v", err)
	}
	err := two.CheckShares(4 << 20)
	if err == nil || !strings.HasPrefix(err.Error(), "Volumes.ContentBytesInFlight 4Mi (--content-bytes-in-flight) holds less than one answer of each of the 2 content providers at once (5Mi, the sum of their bounds)") {
		t.Errorf("bounds beyond the budget: %v", err)
	}
	huge := Providers{Content: &bounded{max: 1 << 62}, Backends: map[string]Backend{"b": backend{x: &bounded{max: 1 << 62}}, "c": backend{x: &bounded{max: 1 << 62}}}}
	if err := huge.CheckShares(1 << 30); err == nil {
		t.Error("bounds that overflow: no error")
	}
	one := Providers{Content: &bounded{max: 8 << 20}}
	if err := one.CheckShares(1 << 20); err != nil {
		t.Errorf("a single provider: %v", err)
	}
}
