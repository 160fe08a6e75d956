package boltstore_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

// A relaxed write is visible at once, synced within RelaxedSyncInterval (or by
// the next durable write, or Close), and a relaxed delete likewise.
func TestRelaxedWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	ctx := t.Context()
	if err := s.PutRelaxed(ctx, storetest.FullRecord("relaxed-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "relaxed-1"); err != nil {
		t.Fatalf("relaxed write not visible: %v", err)
	}
	if !s.Unsynced() {
		t.Error("a relaxed commit does not wait for a sync")
	}
	// The next durable commit's fdatasync takes the relaxed one along.
	if err := s.Put(ctx, storetest.FullRecord("durable-1")); err != nil {
		t.Fatal(err)
	}
	if s.Unsynced() {
		t.Error("a durable commit after a relaxed one left it unsynced")
	}
	// Without a durable commit, the timer syncs.
	if err := s.DeleteRelaxed(ctx, "durable-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "durable-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("relaxed delete not visible: %v", err)
	}
	deadline := time.Now().Add(boltstore.RelaxedSyncInterval + 5*time.Second)
	for s.Unsynced() {
		if time.Now().After(deadline) {
			t.Fatalf("relaxed commit still unsynced after %s", time.Since(deadline.Add(-boltstore.RelaxedSyncInterval-5*time.Second)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.PutRelaxed(ctx, storetest.FullRecord("relaxed-2")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	defer s.Close()
	recs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ids := fmt.Sprint(recordIDs(recs)); ids != "[relaxed-1 relaxed-2]" {
		t.Errorf("after reopening: %s, want [relaxed-1 relaxed-2]", ids)
	}
}

func recordIDs(recs []*store.Record) []string {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.VolumeID
	}
	return ids
}

// A relaxed write survives a crash of the process (a kill -9, an OOM kill):
// it is in the kernel's page cache, which the next Open reads. The writer is
// this test binary run again, killed right after its relaxed Put returned,
// before any sync.
func TestRelaxedWriteSurvivesKill(t *testing.T) {
	if path := os.Getenv("BOLTSTORE_RELAXED_CHILD"); path != "" {
		s, err := boltstore.Open(path, boltstore.Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := s.PutRelaxed(t.Context(), storetest.FullRecord("written-then-killed")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if !s.Unsynced() {
			fmt.Fprintln(os.Stderr, "the relaxed write was synced: the test proves nothing")
			os.Exit(2)
		}
		fmt.Println("written")
		p, _ := os.FindProcess(os.Getpid())
		_ = p.Kill() // SIGKILL: no Close, no sync, no deferred function
		select {}
	}
	path := filepath.Join(t.TempDir(), "state.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRelaxedWriteSurvivesKill$")
	cmd.Env = append(os.Environ(), "BOLTSTORE_RELAXED_CHILD="+path)
	out, err := cmd.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != -1 || string(out) != "written\n" {
		t.Fatalf("child: %v, output %q; want it killed after writing", err, out)
	}
	s := open(t, path)
	defer s.Close()
	if _, err := s.Get(t.Context(), "written-then-killed"); err != nil {
		t.Errorf("the relaxed write did not survive the kill: %v", err)
	}
}
