package boltstore

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

// The timer's sync of relaxed commits does not hold up the writers: a write
// commits while the fdatasync is in progress (it used to wait for the disk
// under the group's lock), and Close waits for that sync to finish.
func TestRelaxedSyncDoesNotBlockWriters(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	inSync, release := make(chan struct{}), make(chan struct{})
	s.group.beforeSync = func() {
		close(inSync)
		<-release
	}
	ctx := t.Context()
	if err := s.PutRelaxed(ctx, storetest.FullRecord("relaxed-1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inSync:
	case <-time.After(RelaxedSyncInterval + 10*time.Second):
		t.Fatal("the relaxed commit was not synced")
	}
	s.group.beforeSync = nil // the next timer's sync runs through
	wrote := make(chan error, 2)
	go func() { wrote <- s.PutRelaxed(ctx, storetest.FullRecord("relaxed-2")) }()
	go func() { wrote <- s.Put(ctx, storetest.FullRecord("durable-1")) }()
	for range 2 {
		select {
		case err := <-wrote:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a write waited for the timer's sync")
		}
	}
	if !s.Unsynced() {
		t.Error("Unsynced is false while a sync is in progress")
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the sync in progress finished", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
