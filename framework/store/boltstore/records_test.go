package boltstore_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

// Get reads the records Open loaded and the writes since (up to
// CachedRecords of them), not the file: a lookup and a copy. A read
// transaction and a JSON decode of a full record allocate several times as
// much.
func TestGetReadsNoTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	if err := s.Put(t.Context(), storetest.FullRecord("vol-put")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path) // vol-put is one Open loaded
	defer s.Close()
	if err := s.PutRelaxed(t.Context(), storetest.FullRecord("vol-relaxed")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"vol-put", "vol-relaxed"} {
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := s.Get(t.Context(), id); err != nil {
				t.Fatal(err)
			}
		})
		// A copy of a full record: the record, two maps, FSGroup, Source and
		// its two slices. The decode took over 40.
		if allocs > 12 {
			t.Errorf("Get(%s) allocates %.0f times, want at most 12 (a copy, no decode)", id, allocs)
		}
	}
}

// A write that fails leaves Get where the file is.
func TestGetAfterFailedWrite(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	defer s.Close()
	ctx := t.Context()
	r := storetest.FullRecord(strings.Repeat("k", 40000)) // above bbolt's largest key
	if err := s.Put(ctx, r); err == nil {
		t.Fatal("Put of a record with a 40,000-byte ID succeeded; the test needs a write bbolt refuses")
	}
	if _, err := s.Get(ctx, r.VolumeID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after a failed Put = %v, want ErrNotFound", err)
	}
	// In a batch with a good write, which still lands.
	var wg sync.WaitGroup
	for _, id := range []string{r.VolumeID, "vol-good"} {
		wg.Go(func() { _ = s.Put(ctx, storetest.FullRecord(id)) })
	}
	wg.Wait()
	if _, err := s.Get(ctx, r.VolumeID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after a failed batched Put = %v, want ErrNotFound", err)
	}
	if _, err := s.Get(ctx, "vol-good"); err != nil {
		t.Errorf("Get of the good write beside it: %v", err)
	}
}

// Concurrent writes of one record end with Get showing what the file holds:
// the writes are applied in the order they were committed.
func TestGetFollowsCommitOrder(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	defer s.Close()
	ctx := t.Context()
	for round := range 20 {
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				r := storetest.FullRecord("vol-a")
				r.Size = int64(round*100 + i)
				var err error
				if i%5 == 4 {
					err = s.DeleteRelaxed(ctx, "vol-a")
				} else {
					err = s.PutRelaxed(ctx, r)
				}
				if err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		list, err := s.List(ctx) // the file
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, "vol-a")
		switch {
		case len(list) == 0 && !errors.Is(err, store.ErrNotFound):
			t.Fatalf("round %d: the file has no record, Get = %v, %v", round, got, err)
		case len(list) == 1 && err != nil:
			t.Fatalf("round %d: the file has size %d, Get: %v", round, list[0].Size, err)
		case len(list) == 1 && got.Size != list[0].Size:
			t.Fatalf("round %d: the file has size %d, Get %d", round, list[0].Size, got.Size)
		}
	}
}

// Beyond CachedRecords records, Get reads the ones it does not hold from the
// file, after Open and after writes alike, and reads each as last written.
func TestGetBeyondTheCachedRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	ctx := t.Context()
	n := boltstore.CachedRecords + 60
	id := func(i int) string { return fmt.Sprintf("vol-%04d", i) }
	for i := range n {
		r := storetest.FullRecord(id(i))
		r.Size = int64(i)
		if err := s.PutRelaxed(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, deleted map[int]bool) {
		t.Helper()
		for i := range n {
			got, err := s.Get(ctx, id(i))
			switch {
			case deleted[i] && !errors.Is(err, store.ErrNotFound):
				t.Fatalf("%s: Get(%s) of a deleted record = %v, %v", when, id(i), got, err)
			case deleted[i]:
			case err != nil:
				t.Fatalf("%s: Get(%s): %v", when, id(i), err)
			case got.Size != int64(i):
				t.Fatalf("%s: Get(%s).Size = %d, want %d", when, id(i), got.Size, i)
			}
		}
	}
	check("after the writes", nil)
	deleted := map[int]bool{}
	for i := 0; i < n; i += 7 {
		if err := s.Delete(ctx, id(i)); err != nil {
			t.Fatal(err)
		}
		deleted[i] = true
	}
	check("after deletes", deleted)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	defer s.Close()
	check("after a reopen", deleted)
}
