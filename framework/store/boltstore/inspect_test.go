package boltstore_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

func TestInspectHealthy(t *testing.T) {
	path, recs := makeStore(t, 30, 512)
	s := open(t, path)
	id := s.ID()
	s.Close()
	putRaw(t, path, "vol-zz-bad", "not json")

	before := readFile(t, path)
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	ps, _, m := fileLayout(before)
	if rep.Path != path || rep.Size != int64(len(before)) || rep.PageSize != ps || rep.TxID != m.TxID {
		t.Errorf("Inspect: path %s, size %d, page size %d, txid %d; want %s, %d, %d, %d",
			rep.Path, rep.Size, rep.PageSize, rep.TxID, path, len(before), ps, m.TxID)
	}
	if rep.SchemaVersion != boltstore.SchemaVersion || rep.StoreID != id {
		t.Errorf("Inspect: schema %d, ID %q; want %d, %q", rep.SchemaVersion, rep.StoreID, boltstore.SchemaVersion, id)
	}
	if rep.RecordCount != 31 {
		t.Errorf("RecordCount = %d, want 31", rep.RecordCount)
	}
	wantRecords(t, rep.Records, recs)
	if len(rep.Undecodable) != 1 || rep.Undecodable[0].Key != "vol-zz-bad" || rep.Undecodable[0].Head != `"not json"` ||
		!strings.Contains(rep.Undecodable[0].Reason, "cannot be decoded") {
		t.Errorf("Undecodable = %+v, want vol-zz-bad", rep.Undecodable)
	}
	// Inspect changes nothing (it does not quarantine).
	if after := readFile(t, path); string(after) != string(before) {
		t.Error("Inspect changed the file")
	}
}

func TestInspectDamaged(t *testing.T) {
	path, recs := makeStore(t, 500, 1024)
	if err := os.Truncate(path, 256<<10); err != nil {
		t.Fatal(err)
	}
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{})
	t.Logf("Inspect: %v", err)
	if !errors.Is(err, boltstore.ErrCorrupt) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("Inspect: %v, want ErrCorrupt for a truncated file", err)
	}
	if rep == nil {
		t.Fatal("Inspect returned no report for a file with valid meta pages")
	}
	if rep.Size != 256<<10 || rep.PageSize == 0 || rep.TxID == 0 || rep.StoreID == "" || rep.SchemaVersion != boltstore.SchemaVersion {
		t.Errorf("report %+v lacks what the first pages hold", rep)
	}
	// What lies in the first 256KiB is read, the rest is not.
	if len(rep.Records) == 0 || len(rep.Records) >= len(recs) {
		t.Errorf("Inspect read %d of %d records, want some but not all", len(rep.Records), len(recs))
	}
	checkSubset(t, rep.Records, recs)

	// A file without a valid meta page gives no report.
	garbage := make([]byte, 64<<10)
	fill(garbage, 3)
	writeFile(t, path, garbage)
	rep, err = boltstore.Inspect(path, boltstore.InspectOptions{})
	if !errors.Is(err, boltstore.ErrCorrupt) || rep != nil {
		t.Errorf("Inspect(garbage) = %+v, %v; want nil, ErrCorrupt", rep, err)
	}
}

// checkSubset checks that every record of got is the record of want with its ID.
func checkSubset(t *testing.T, got, want []*store.Record) {
	t.Helper()
	byID := make(map[string]*store.Record)
	for _, r := range want {
		byID[r.VolumeID] = r
	}
	for _, r := range got {
		if diff := storetest.Diff(byID[r.VolumeID], r); diff != "" {
			t.Errorf("record %s: %s", r.VolumeID, diff)
		}
	}
}

func TestInspectLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	defer s.Close()
	const timeout = 200 * time.Millisecond
	start := time.Now()
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{Timeout: timeout})
	elapsed := time.Since(start)
	t.Logf("Inspect after %v: %v", elapsed, err)
	if !errors.Is(err, boltstore.ErrLocked) || rep != nil {
		t.Fatalf("Inspect of an open store = %v, %v; want ErrLocked", rep, err)
	}
	for _, want := range []string{path, "stop the driver or use the live listing"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q", want)
		}
	}
	if elapsed < timeout/2 || elapsed > timeout+time.Second {
		t.Errorf("Inspect gave up after %v, want about %v", elapsed, timeout)
	}
	if _, err := boltstore.Salvage(path); !errors.Is(err, boltstore.ErrLocked) {
		t.Errorf("Salvage of an open store: %v, want ErrLocked", err)
	}

	// Once the driver is gone, Inspect works.
	s.Close()
	if _, err := boltstore.Inspect(path, boltstore.InspectOptions{Timeout: timeout}); err != nil {
		t.Errorf("Inspect after Close: %v", err)
	}
	// And a driver can open the store again.
	open(t, path).Close()
}

func TestInspectMissing(t *testing.T) {
	_, err := boltstore.Inspect(filepath.Join(t.TempDir(), "state.db"), boltstore.InspectOptions{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Inspect of a missing file: %v, want ErrNotExist", err)
	}
}

func TestSalvage(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		path, recs := makeStore(t, 50, 1024)
		got, err := boltstore.Salvage(path)
		if err != nil {
			t.Fatalf("Salvage: %v", err)
		}
		wantRecords(t, got, recs)
	})
	t.Run("one leaf damaged", func(t *testing.T) {
		path, recs := makeStore(t, 500, 1024)
		b := readFile(t, path)
		ps, _, _ := fileLayout(b)
		id, lost := volumesLeaf(t, b)
		h := headerAt(b, int(id)*ps)
		h.Flags = 0x40
		putHeader(b, int(id)*ps, h)
		writeFile(t, path, b)
		if _, err := boltstore.Open(path, boltstore.Options{}); !errors.Is(err, boltstore.ErrCorrupt) {
			t.Fatalf("Open: %v, want ErrCorrupt", err)
		}

		got, err := boltstore.Salvage(path)
		t.Logf("Salvage: %d records, %v", len(got), err)
		if !errors.Is(err, boltstore.ErrCorrupt) || !strings.Contains(err.Error(), "type 0x40") {
			t.Errorf("Salvage error = %v, want ErrCorrupt naming the page", err)
		}
		if lost == 0 || len(got) != len(recs)-lost {
			t.Errorf("Salvage returned %d records, want %d (all but the %d on page %d)", len(got), len(recs)-lost, lost, id)
		}
		checkSubset(t, got, recs)
	})
	t.Run("garbage", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		b := make([]byte, 64<<10)
		fill(b, 4)
		writeFile(t, path, b)
		got, err := boltstore.Salvage(path)
		if !errors.Is(err, boltstore.ErrCorrupt) || len(got) != 0 {
			t.Errorf("Salvage(garbage) = %d records, %v; want none, ErrCorrupt", len(got), err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		writeFile(t, path, nil)
		if got, err := boltstore.Salvage(path); !errors.Is(err, boltstore.ErrCorrupt) || len(got) != 0 {
			t.Errorf("Salvage(empty) = %d records, %v; want none, ErrCorrupt", len(got), err)
		}
	})
}
