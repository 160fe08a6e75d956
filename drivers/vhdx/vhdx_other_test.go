//go:build !windows

package vhdx

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

// Without a host, New uses the system's: on other systems than Windows,
// Create is refused as not supported while Delete and List find nothing,
// and nothing is stamped.
func TestNewWithoutHost(t *testing.T) {
	b, err := New(Options{Dir: filepath.Join(t.TempDir(), "vhdx")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(t.Context(), vol(1<<30)); !errors.Is(err, api.ErrNotSupported) {
		t.Errorf("Create = %v, want api.ErrNotSupported", err)
	}
	if err := b.Delete(t.Context(), vol(0)); err != nil {
		t.Errorf("Delete = %v, want nil", err)
	}
	if ids, err := b.List(t.Context()); err != nil || len(ids) != 0 {
		t.Errorf("List = %v, %v; want nothing", ids, err)
	}
	if err := b.SetStamp(t.Context(), "store-1"); err != nil {
		t.Errorf("SetStamp = %v, want nil", err)
	}
	if st, err := b.Stamp(t.Context()); st != "" || err != nil {
		t.Errorf("Stamp = %q, %v; want none", st, err)
	}
	if _, err := os.Stat(b.opts.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Dir created on a system without VHDX: %v", err)
	}
}
