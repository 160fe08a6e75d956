package csiserver

import (
	"slices"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// TestOwnAttributes: the framework's own attributes are declared like a
// driver's and are exactly the keys it takes out before the backend sees the
// rest; the default backend applies when the pod names none.
func TestOwnAttributes(t *testing.T) {
	own := OwnAttributes([]string{"a", "b"}, "b")
	keys, want := own.Keys(), slices.Clone(volume.FrameworkParams)
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("own attributes %v, FrameworkParams %v", keys, want)
	}
	vals, err := own.Parse(api.Params{"other": "x"})
	if err != nil || vals.String(api.ParamBackend) != "b" || vals.Int(api.ParamSize) != 0 {
		t.Fatalf("no attributes: %v %v, want backend b, size 0", vals, err)
	}
	vals, err = own.Parse(api.Params{api.ParamBackend: "a", api.ParamSize: "2Mi"})
	if err != nil || vals.String(api.ParamBackend) != "a" || vals.Int(api.ParamSize) != 2<<20 {
		t.Fatalf("backend a, size 2Mi: %v %v", vals, err)
	}
	if _, err := own.Parse(api.Params{api.ParamBackend: "c", api.ParamSize: "0"}); err == nil {
		t.Fatal("backend c, size 0 accepted")
	}
}
