package memstore_test

import (
	"testing"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return memstore.New() })
}

func TestID(t *testing.T) {
	a, b := memstore.New(), memstore.New()
	if len(a.ID()) != 32 {
		t.Errorf("ID() = %q, want 32 hex digits", a.ID())
	}
	if a.ID() == b.ID() {
		t.Errorf("two stores share the ID %q", a.ID())
	}
	if got := memstore.NewWithID("node-a").ID(); got != "node-a" {
		t.Errorf("NewWithID(node-a).ID() = %q", got)
	}
}
