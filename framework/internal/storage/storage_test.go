package storage

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

type backend struct {
	lister    Lister
	finder    Finder
	mountOnly bool
}

func (b backend) Create(context.Context, *api.Volume) (api.Source, error) { return api.Source{}, nil }
func (b backend) Delete(context.Context, *api.Volume) error               { return nil }
func (b backend) Lister() Lister                                          { return b.lister }
func (b backend) Finder() Finder                                          { return b.finder }
func (b backend) MountOnly() bool                                         { return b.mountOnly }

type lister struct{}

func (lister) List(context.Context) ([]string, error) { return nil, nil }

type finder struct {
	src api.Source
	err error
}

func (f finder) Find(context.Context, *api.Volume) (api.Source, error) { return f.src, f.err }

type mounts map[string][]string

func (m mounts) MountedAt(src api.Source) ([]string, error) { return m[src.Path], nil }

// TestRecordsAndIntent: which backends get a durable intent record and
// which records are written relaxed.
func TestRecordsAndIntent(t *testing.T) {
	for _, tc := range []struct {
		name          string
		b             backend
		intent, relax bool
	}{
		{"no finder", backend{lister: lister{}}, true, false},
		{"finder only", backend{finder: finder{}}, true, false},
		{"finder and lister", backend{finder: finder{}, lister: lister{}}, false, false},
		{"finder, mount only", backend{finder: finder{}, mountOnly: true}, false, true},
		{"mount only without finder", backend{mountOnly: true}, true, false},
	} {
		if got := NeedsIntent(tc.b); got != tc.intent {
			t.Errorf("%s: NeedsIntent = %v, want %v", tc.name, got, tc.intent)
		}
		if got := Relaxed(tc.b); got != tc.relax {
			t.Errorf("%s: Relaxed = %v, want %v", tc.name, got, tc.relax)
		}
	}
}

// TestRefuseIfMounted: storage mounted anywhere but at another volume's
// target is refused ErrBusy, naming where; the recorded source counts only
// for a backend without a Finder.
func TestRefuseIfMounted(t *testing.T) {
	const podA, podB = "9f1c2a34-5b6d-4e7f-8a9b-0c1d2e3f4a5b", "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
	root := t.TempDir()
	target := func(uid, name string) string {
		return filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~csi", name, "mount")
	}
	v := &api.Volume{ID: api.VolumeHandle(podA, "data"), Backend: "dir"}
	other := target(podB, "data")
	ctx := context.Background()

	s := New(root, false, mounts{"/backing": {other}})
	b := backend{finder: finder{src: api.Source{Path: "/backing"}}}
	if err := s.RefuseIfMounted(ctx, b, v, nil); err != nil {
		t.Errorf("mounted only at another volume's target: %v, want nil", err)
	}

	s = New(root, false, mounts{"/backing": {other, "/mnt/elsewhere", target(podA, "data")}})
	err := s.RefuseIfMounted(ctx, b, v, nil)
	if !errors.Is(err, api.ErrBusy) || !strings.Contains(err.Error(), "still mounted at /mnt/elsewhere, "+target(podA, "data")+";") {
		t.Errorf("mounted at its own target and elsewhere: %v, want ErrBusy naming both", err)
	}

	recorded := &api.Source{Path: "/backing"}
	if err := s.RefuseIfMounted(ctx, backend{}, v, recorded); !errors.Is(err, api.ErrBusy) {
		t.Errorf("no Finder, recorded source mounted: %v, want ErrBusy", err)
	}
	if err := s.RefuseIfMounted(ctx, backend{}, v, nil); err != nil {
		t.Errorf("no Finder, nothing recorded: %v, want nil", err)
	}
	gone := backend{finder: finder{err: api.ErrNotFound}}
	if err := s.RefuseIfMounted(ctx, gone, v, recorded); err != nil {
		t.Errorf("Finder finds nothing: %v, want nil (the Finder's answer wins over the record)", err)
	}
	broken := backend{finder: finder{err: errors.New("disk on fire")}}
	if err := s.RefuseIfMounted(ctx, broken, v, nil); err == nil || !strings.Contains(err.Error(), "finding the storage of volume "+v.ID+": disk on fire") {
		t.Errorf("Finder fails: %v, want its error", err)
	}
}
