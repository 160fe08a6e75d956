package boltstore_test

import (
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

var mutationSeed = flag.Uint64("mutation.seed", 0, "seed of TestOpenMutatedFile (0: a new one)")

// TestMain caps the fuzzer's minimization of new inputs at 200 runs unless
// -fuzzminimizetime is given. FuzzOpen's inputs are state files of 10KiB, and Go
// minimizes every input that finds new coverage for up to 60s by default, which
// at that size never finishes: the workers minimized instead of fuzzing (95
// executions in 60s).
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.fuzzminimizetime" })
	if !set {
		if err := flag.Set("test.fuzzminimizetime", "200x"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// smallStore returns the bytes of a valid store with a few records, one of them
// quarantined, so that every bucket of the layout exists. Its pages are 1KiB
// (bbolt's smallest; a file keeps the page size it was made with) and the file
// ends at the high-water mark: a small file is what makes the fuzzer's
// minimization of an interesting input finish in time, and small pages put the
// records on several leaves under a branch page.
func smallStore(t testing.TB) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{PageSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := open(t, path)
	for _, id := range []string{"vol-a", "vol-b", "vol-c"} {
		if err := s.Put(t.Context(), storetest.FullRecord(id)); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("volumes")).Put([]byte("vol-bad"), []byte("{"))
	})
	s = open(t, path)
	if got := s.Quarantined(); len(got) != 1 {
		t.Fatalf("Quarantined() = %q, want vol-bad", got)
	}
	s.Close()
	b := readFile(t, path)
	ps, _, m := fileLayout(b)
	if ps != 1024 {
		t.Fatalf("page size %d, want 1024", ps)
	}
	return b[:int(m.HWM)*ps]
}

// checkOpen opens the file at path, which may hold anything: Open must succeed or
// fail with ErrCorrupt or ErrVersion, and List must work on an open store, and
// with roundTrip a Put and a Get too. Inspect and Salvage must not crash either.
func checkOpen(t *testing.T, path string, roundTrip bool) (outcome string) {
	t.Helper()
	s, err := boltstore.Open(path, boltstore.Options{Timeout: 100 * time.Millisecond})
	switch {
	case errors.Is(err, boltstore.ErrCorrupt):
		outcome = "ErrCorrupt"
	case errors.Is(err, store.ErrVersion):
		outcome = "ErrVersion"
	case err != nil:
		t.Fatalf("Open: %v, want success, ErrCorrupt or ErrVersion", err)
	case len(s.Quarantined()) > 0:
		outcome = "opened, quarantined a record"
	default:
		outcome = "opened"
	}
	if err == nil {
		if _, err := s.List(t.Context()); err != nil {
			t.Fatalf("List: %v", err)
		}
		if roundTrip {
			r := storetest.FullRecord("vol-new")
			if err := s.Put(t.Context(), r); err != nil {
				t.Fatalf("Put: %v", err)
			}
			got, err := s.Get(t.Context(), "vol-new")
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if diff := storetest.Diff(r, got); diff != "" {
				t.Fatalf("Get after Put: %s", diff)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if _, err := boltstore.Inspect(path, boltstore.InspectOptions{Timeout: 100 * time.Millisecond}); err != nil &&
		!errors.Is(err, boltstore.ErrCorrupt) {
		t.Fatalf("Inspect: %v, want nil or ErrCorrupt", err)
	}
	if _, err := boltstore.Salvage(path); err != nil && !errors.Is(err, boltstore.ErrCorrupt) {
		t.Fatalf("Salvage: %v, want nil or ErrCorrupt", err)
	}
	return outcome
}

// TestOpenMutatedFile opens 300 copies of a valid file, each with one or eight
// random bytes changed at a random offset: anywhere in the file for half of them,
// else in the first KiB of a page below the high-water mark, where bbolt keeps a
// page's header, elements, keys and values. Run with -mutation.seed to repeat a
// run.
func TestOpenMutatedFile(t *testing.T) {
	base := smallStore(t)
	ps, _, m := fileLayout(base)
	seed := *mutationSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (repeat with -mutation.seed=%d); file of %d bytes, %d pages in use", seed, seed, len(base), m.HWM)
	r := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	outcomes := make(map[string]int)
	for i := range 300 {
		b := append([]byte(nil), base...)
		off, n := r.IntN(len(b)), 1
		if i%2 == 0 {
			off = r.IntN(int(m.HWM))*ps + r.IntN(1024)
		}
		if r.IntN(2) == 0 {
			n = 8
		}
		for j := off; j < min(off+n, len(b)); j++ {
			b[j] = byte(r.Uint32())
		}
		path := filepath.Join(dir, "state.db")
		writeFile(t, path, b)
		t.Run("", func(t *testing.T) {
			defer func() {
				if t.Failed() {
					t.Logf("mutation %d: %d bytes at offset %d (seed %d)", i, n, off, seed)
				}
			}()
			outcomes[checkOpen(t, path, true)]++
		})
	}
	t.Logf("outcomes: %v", outcomes)
}

// FuzzOpen writes arbitrary bytes as the state file: Open never panics or faults,
// and anything it opens works. The seeds are a valid file and some damaged ones.
func FuzzOpen(f *testing.F) {
	base := smallStore(f)
	ps, _, _ := fileLayout(base)
	f.Add(base)
	f.Add(base[:ps])
	f.Add(base[:len(base)-ps])
	f.Add(append(make([]byte, ps), base[ps:]...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "state.db")
		writeFile(t, path, b)
		checkOpen(t, path, false)
	})
}
