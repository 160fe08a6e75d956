package boltstore_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

func open(t testing.TB, path string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, filepath.Join(t.TempDir(), "state.db"))
	})
}

func TestReopen(t *testing.T) {
	storetest.RunReopen(t, func(t *testing.T, dir string) store.Store {
		return open(t, filepath.Join(dir, "state.db"))
	})
}

func TestOpenCreatesParentDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "state.db")
	s := open(t, path)
	defer s.Close()
	if s.Path() != path {
		t.Errorf("Path() = %q, want %q", s.Path(), path)
	}
	fi, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	// On Windows the mode bits are not meaningful.
	if os.PathSeparator == '/' && fi.Mode().Perm() != 0o700 {
		t.Errorf("parent dir mode = %v, want 0700", fi.Mode().Perm())
	}
}

func TestOpenNegativeTimeout(t *testing.T) {
	_, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"), boltstore.Options{Timeout: -time.Second})
	if err == nil {
		t.Fatal("Open with a negative timeout succeeded")
	}
}

// TestOpenLocked opens the same file twice in one process. bbolt's flock is held
// per open file description, so the second Open (a new os.OpenFile) conflicts with
// the first exactly as a second process would.
func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	first := open(t, path)
	defer first.Close()

	const timeout = 200 * time.Millisecond
	start := time.Now()
	second, err := boltstore.Open(path, boltstore.Options{Timeout: timeout})
	elapsed := time.Since(start)
	if err == nil {
		second.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, boltstore.ErrLocked) {
		t.Errorf("error = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the file %s", err, path)
	}
	if elapsed < timeout/2 || elapsed > timeout+time.Second {
		t.Errorf("second Open gave up after %v, want about %v", elapsed, timeout)
	}
	t.Logf("error after %v: %v", elapsed, err)

	// Once the first store is closed, the file can be opened again.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	third, err := boltstore.Open(path, boltstore.Options{Timeout: timeout})
	if err != nil {
		t.Fatalf("Open after the holder closed: %v", err)
	}
	third.Close()
}

// rawUpdate edits the closed store file directly with bbolt.
func rawUpdate(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schemaVersion"), []byte(fmt.Sprint(boltstore.SchemaVersion+1)))
	})
	s, err := boltstore.Open(path, boltstore.Options{})
	if err == nil {
		s.Close()
		t.Fatal("Open of a newer schema succeeded")
	}
	if !errors.Is(err, store.ErrVersion) {
		t.Errorf("error = %v, want ErrVersion", err)
	}
	// The refused open released the file.
	rawUpdate(t, path, func(*bolt.Tx) error { return nil })
}

func TestGetRefusesNewerRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	if err := s.Put(t.Context(), storetest.FullRecord("vol-old")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A newer driver wrote this record; its shape has changed too.
	newer := fmt.Sprintf(`{"version":%d,"volumeID":"vol-new","pod":"not-an-object"}`, store.RecordVersion+1)
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("volumes")).Put([]byte("vol-new"), []byte(newer))
	})

	s = open(t, path)
	defer s.Close()
	if _, err := s.Get(t.Context(), "vol-new"); !errors.Is(err, store.ErrVersion) {
		t.Errorf("Get(newer) error = %v, want ErrVersion", err)
	}
	if _, err := s.List(t.Context()); !errors.Is(err, store.ErrVersion) {
		t.Errorf("List with a newer record: error = %v, want ErrVersion", err)
	}
	if _, err := s.Get(t.Context(), "vol-old"); err != nil {
		t.Errorf("Get(old) = %v", err)
	}
}

func TestClosedErrorWrapsBolt(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	s.Close()
	if _, err := s.List(t.Context()); !errors.Is(err, bolt.ErrDatabaseNotOpen) {
		t.Errorf("List after Close error = %v, want ErrDatabaseNotOpen", err)
	}
}

// BenchmarkPutSerial measures one writer: each Put pays the batch delay and an
// fsync alone.
func BenchmarkPutSerial(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "state.db"))
	defer s.Close()
	r := storetest.FullRecord("")
	i := 0
	for b.Loop() {
		r.VolumeID = fmt.Sprintf("vol-%08d", i)
		i++
		if err := s.Put(b.Context(), r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPutParallel measures many concurrent writers (32 goroutines per CPU in
// b.RunParallel) whose Puts share transactions and fsyncs.
func BenchmarkPutParallel(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "state.db"))
	defer s.Close()
	var n atomic.Int64
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		r := storetest.FullRecord("")
		for pb.Next() {
			r.VolumeID = fmt.Sprintf("vol-%08d", n.Add(1))
			if err := s.Put(b.Context(), r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
