package boltstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

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
func rawUpdate(t testing.TB, path string, fn func(tx *bolt.Tx) error) {
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

// TestDowngradeNamesTheWriter: Open records Options.Writer; an older driver
// meeting a file of a newer schema names both versions, the writer recorded in
// the file and the ways out, and changes nothing.
func TestDowngradeNamesTheWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := boltstore.Open(path, boltstore.Options{Writer: "scratch.csi.ephemera.dev v0.2.0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{})
	if err != nil || rep.Writer != "scratch.csi.ephemera.dev v0.2.0" {
		t.Fatalf("Inspect: writer %q, %v", rep.Writer, err)
	}
	// The newer driver (its own Open would write this) bumps the schema.
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schemaVersion"), []byte(fmt.Sprint(boltstore.SchemaVersion+1)))
	})
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err = boltstore.Open(path, boltstore.Options{Writer: "scratch.csi.ephemera.dev v0.1.0"})
	if err == nil {
		s.Close()
		t.Fatal("an older driver opened a newer file")
	}
	t.Logf("Open: %v", err)
	if !errors.Is(err, store.ErrVersion) || errors.Is(err, boltstore.ErrCorrupt) {
		t.Errorf("error = %v, want ErrVersion and not ErrCorrupt (the file must not be moved aside)", err)
	}
	for _, want := range []string{
		path, fmt.Sprintf("file schema %d, this driver knows %d", boltstore.SchemaVersion+1, boltstore.SchemaVersion),
		`last opened by "scratch.csi.ephemera.dev v0.2.0"`, `"scratch.csi.ephemera.dev v0.1.0" cannot read it`,
		"Run that version (or a newer one) again", "move the file aside",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q", want)
		}
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
		t.Errorf("the refused open changed the file (%v)", err)
	}
}

// TestOpenRefusesNewerRecord: a record written by a newer driver is not
// quarantined (it is not damaged); Open refuses the whole file instead.
func TestOpenRefusesNewerRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	if err := s.Put(t.Context(), storetest.FullRecord("vol-old")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A newer driver wrote this record; its shape has changed too. Another record
	// is damaged: nothing may be quarantined in a file Open refuses.
	newer := fmt.Sprintf(`{"version":%d,"volumeID":"vol-new","pod":"not-an-object"}`, store.RecordVersion+1)
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("volumes"))
		if err := b.Put([]byte("vol-bad"), []byte("{garbage")); err != nil {
			return err
		}
		return b.Put([]byte("vol-new"), []byte(newer))
	})

	s, err := boltstore.Open(path, boltstore.Options{})
	if err == nil {
		s.Close()
		t.Fatal("Open of a file with a newer record succeeded")
	}
	t.Logf("Open: %v", err)
	if !errors.Is(err, store.ErrVersion) {
		t.Errorf("error = %v, want ErrVersion", err)
	}
	for _, want := range []string{path, "vol-new", "version 2, this driver knows 1", "downgrades of the state file are not supported", "move the file aside"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q", want)
		}
	}
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if len(rep.Quarantined) != 0 || len(rep.Undecodable) != 2 || rep.RecordCount != 3 {
		t.Errorf("after the refused Open: %d quarantined, %d undecodable of %d records; want 0, 2 of 3",
			len(rep.Quarantined), len(rep.Undecodable), rep.RecordCount)
	}
}

func TestClosedErrorWrapsBolt(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "state.db"))
	s.Close()
	if _, err := s.List(t.Context()); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
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

func TestQuarantine(t *testing.T) {
	tests := []struct {
		name string
		key  string
		raw  string
	}{
		{"garbage", "vol-bad", "{garbage\x00\xff"},
		{"wrong shape", "vol-bad", `{"version":1,"volumeID":"vol-bad","pod":"not-an-object"}`},
		{"another volume's record", "vol-bad", `{"version":1,"volumeID":"vol-other"}`},
		{"empty", "vol-bad", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s := open(t, path)
			var want []*store.Record
			for _, id := range []string{"vol-a", "vol-c", "vol-d"} {
				r := storetest.FullRecord(id)
				if err := s.Put(t.Context(), r); err != nil {
					t.Fatal(err)
				}
				want = append(want, r)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			putRaw(t, path, tt.key, tt.raw)

			s = open(t, path)
			if got := s.Quarantined(); !slices.Equal(got, []string{tt.key}) {
				t.Errorf("Quarantined() = %q, want [%s]", got, tt.key)
			}
			list, err := s.List(t.Context())
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			wantRecords(t, list, want)
			if _, err := s.Get(t.Context(), tt.key); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get(%s) = %v, want ErrNotFound", tt.key, err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			wantQuarantine := func(keys ...string) {
				t.Helper()
				rep, err := boltstore.Inspect(path, boltstore.InspectOptions{})
				if err != nil {
					t.Fatalf("Inspect: %v", err)
				}
				if len(rep.Quarantined) != len(keys) {
					t.Fatalf("Inspect: %d quarantined entries, want %d", len(rep.Quarantined), len(keys))
				}
				for i, e := range rep.Quarantined {
					head := tt.raw[:min(len(tt.raw), 64)]
					if e.Key != keys[i] || e.Len != len(tt.raw) || e.Head != strconv.Quote(head) || e.Reason == "" {
						t.Errorf("quarantined entry %d = %+v, want key %s, %d bytes, head %q and a reason", i, e, keys[i], len(tt.raw), head)
					}
				}
				if rep.RecordCount != 3 || len(rep.Undecodable) != 0 {
					t.Errorf("Inspect: %d records, %d undecodable; want 3, 0", rep.RecordCount, len(rep.Undecodable))
				}
			}
			wantQuarantine(tt.key)

			// A reopen quarantines nothing new, and the quarantine stays.
			s = open(t, path)
			if got := s.Quarantined(); len(got) != 0 {
				t.Errorf("Quarantined() after reopen = %q, want none", got)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			wantQuarantine(tt.key)

			// The same volume damaged again: both versions are kept.
			putRaw(t, path, tt.key, tt.raw)
			s = open(t, path)
			if got := s.Quarantined(); !slices.Equal(got, []string{tt.key}) {
				t.Errorf("Quarantined() = %q, want [%s]", got, tt.key)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			wantQuarantine(tt.key, tt.key+"#2")
		})
	}
}

// putRaw stores raw under key in the "volumes" bucket of the closed store at path.
func putRaw(t *testing.T, path, key, raw string) {
	t.Helper()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("volumes")).Put([]byte(key), []byte(raw))
	})
}

func TestID(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s := open(t, path)
	id := s.ID()
	if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
		t.Errorf("ID() = %q, want 32 lower-case hex digits", id)
	}
	s.Close()

	s = open(t, path)
	if s.ID() != id {
		t.Errorf("ID() after reopen = %q, want %q", s.ID(), id)
	}
	s.Close()
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{})
	if err != nil || rep.StoreID != id {
		t.Errorf("Inspect: StoreID %q, %v; want %q", rep.StoreID, err, id)
	}

	other := open(t, filepath.Join(dir, "other.db"))
	if other.ID() == id {
		t.Errorf("a new file has the same ID %q", id)
	}
	other.Close()

	// A file moved aside and recreated is a new identity.
	if err := os.Rename(path, path+".damaged"); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	if s.ID() == id {
		t.Errorf("a recreated file has the old ID %q", id)
	}
	s.Close()
}

// TestIDOlderFile: a file written before store IDs existed gets one at its next
// Open, which then stays.
func TestIDOlderFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	if err := s.Put(t.Context(), storetest.FullRecord("vol-a")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	rawUpdate(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Delete([]byte("storeID"))
	})
	s = open(t, path)
	id := s.ID()
	if len(id) != 32 {
		t.Errorf("ID() of an older file = %q, want one made now", id)
	}
	if _, err := s.Get(t.Context(), "vol-a"); err != nil {
		t.Errorf("Get: %v", err)
	}
	s.Close()
	s = open(t, path)
	defer s.Close()
	if s.ID() != id {
		t.Errorf("ID() after reopen = %q, want %q", s.ID(), id)
	}
}

// TestOpenChecksMetaBucket: the contents of the "meta" bucket are part of the
// file's integrity.
func TestOpenChecksMetaBucket(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(tx *bolt.Tx) error
		wantMsg string
	}{{
		name:    "no volumes bucket",
		edit:    func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("volumes")) },
		wantMsg: `the "volumes" bucket is missing`,
	}, {
		name:    "no meta bucket",
		edit:    func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("meta")) },
		wantMsg: `the "meta" bucket is missing`,
	}, {
		name:    "no schema version",
		edit:    func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Delete([]byte("schemaVersion")) },
		wantMsg: "the schema version is missing",
	}, {
		name:    "bad schema version",
		edit:    func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("schemaVersion"), []byte("1x")) },
		wantMsg: `the schema version "1x" is not a positive number`,
	}, {
		name:    "bad store ID",
		edit:    func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("storeID"), []byte("zz")) },
		wantMsg: `the store ID "zz" is not 32 lower-case hex digits`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			open(t, path).Close()
			rawUpdate(t, path, tt.edit)
			s, err := boltstore.Open(path, boltstore.Options{})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, boltstore.ErrCorrupt) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Open: %v, want ErrCorrupt with %q", err, tt.wantMsg)
			}
			if _, err := boltstore.Inspect(path, boltstore.InspectOptions{}); !errors.Is(err, boltstore.ErrCorrupt) {
				t.Errorf("Inspect: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestOpenBareBboltFile: a bbolt file without buckets (an older driver that
// stopped between bbolt's creation of the file and its first commit) is a new,
// empty store.
func TestOpenBareBboltFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	rawUpdate(t, path, func(*bolt.Tx) error { return nil })
	s := open(t, path)
	defer s.Close()
	if list, err := s.List(t.Context()); err != nil || len(list) != 0 {
		t.Errorf("List = %d records, %v; want none", len(list), err)
	}
	if len(s.ID()) != 32 {
		t.Errorf("ID() = %q", s.ID())
	}
}

// TestOpenConcurrentCreate: processes that start together on a node without a
// state file create one file; one gets it, the others find it locked, and none
// sees a half-made file as damaged.
func TestOpenConcurrentCreate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	const n = 8
	type result struct {
		s   *boltstore.Store
		err error
	}
	start := make(chan struct{})
	results := make(chan result, n)
	for range n {
		go func() {
			<-start
			s, err := boltstore.Open(path, boltstore.Options{Timeout: 300 * time.Millisecond})
			results <- result{s, err}
		}()
	}
	close(start)
	opened := 0
	for range n {
		r := <-results
		switch {
		case r.err == nil:
			opened++
			defer r.s.Close()
		case !errors.Is(r.err, boltstore.ErrLocked):
			t.Errorf("Open: %v, want success or ErrLocked", r.err)
		}
	}
	if opened != 1 {
		t.Errorf("%d Opens succeeded, want 1", opened)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "state.db" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("state directory holds %q, want only state.db", names)
	}
}
