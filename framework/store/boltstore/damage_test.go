package boltstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
	"github.com/ephemera-csi/ephemera/framework/store/storetest"
)

// The bbolt on-disk format (go.etcd.io/bbolt internal/common), written out again
// for the tests rather than shared with check.go, so that one misreading cannot
// hide in both.
type diskMeta struct {
	Magic, Version, PageSize, Flags uint32
	Root, Sequence                  uint64
	Freelist, HWM, TxID, Checksum   uint64
}

type pageHeader struct {
	ID       uint64
	Flags    uint16
	Count    uint16
	Overflow uint32
}

const (
	headerSize = 16
	leafFlag   = 0x02
	branchFlag = 0x01
)

var native = binary.NativeEndian

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func metaAt(b []byte, off int) diskMeta {
	var m diskMeta
	if err := binary.Read(bytes.NewReader(b[off+headerSize:]), native, &m); err != nil {
		panic(err)
	}
	return m
}

// putMeta writes m as the meta of the page at off, with a valid checksum.
func putMeta(b []byte, off int, m diskMeta) {
	var buf bytes.Buffer
	_ = binary.Write(&buf, native, m)
	h := fnv.New64a()
	h.Write(buf.Bytes()[:56])
	m.Checksum = h.Sum64()
	buf.Reset()
	_ = binary.Write(&buf, native, m)
	copy(b[off+headerSize:], buf.Bytes())
}

// fileLayout returns the page size and the offset and contents of the meta page
// bbolt uses (the one with the higher txid; the tests only call it on files whose
// meta pages are both valid).
func fileLayout(b []byte) (ps, off int, m diskMeta) {
	ps = int(metaAt(b, 0).PageSize)
	m0, m1 := metaAt(b, 0), metaAt(b, ps)
	if m1.TxID > m0.TxID {
		return ps, ps, m1
	}
	return ps, 0, m0
}

func headerAt(b []byte, off int) pageHeader {
	var h pageHeader
	if err := binary.Read(bytes.NewReader(b[off:]), native, &h); err != nil {
		panic(err)
	}
	return h
}

func putHeader(b []byte, off int, h pageHeader) {
	var buf bytes.Buffer
	_ = binary.Write(&buf, native, h)
	copy(b[off:], buf.Bytes())
}

// leafValue returns the value of key in the leaf page at off.
func leafValue(b []byte, off int, key string) []byte {
	h := headerAt(b, off)
	for i := range int(h.Count) {
		e := off + headerSize + i*16
		pos, ksize, vsize := native.Uint32(b[e+4:]), native.Uint32(b[e+8:]), native.Uint32(b[e+12:])
		k := b[e+int(pos) : e+int(pos)+int(ksize)]
		if string(k) == key {
			return b[e+int(pos)+int(ksize) : e+int(pos)+int(ksize)+int(vsize)]
		}
	}
	return nil
}

// volumesLeaf returns the page id of the second leaf page of the "volumes" bucket,
// and how many records it holds. The bucket must span several pages.
func volumesLeaf(t testing.TB, b []byte) (id uint64, records int) {
	t.Helper()
	ps, _, m := fileLayout(b)
	root := int(m.Root) * ps
	if h := headerAt(b, root); h.Flags != leafFlag {
		t.Fatalf("root bucket page %d has flags %#x, want a leaf", m.Root, h.Flags)
	}
	v := leafValue(b, root, "volumes")
	if len(v) < 16 || native.Uint64(v) == 0 {
		t.Fatal(`"volumes" is not a bucket with pages of its own`)
	}
	// The second child of the bucket's root branch, then first children down to a
	// leaf.
	off := int(native.Uint64(v)) * ps
	for i := 1; headerAt(b, off).Flags == branchFlag; i = 0 {
		off = int(native.Uint64(b[off+headerSize+i*16+8:])) * ps
	}
	h := headerAt(b, off)
	if h.Flags != leafFlag {
		t.Fatalf("page %d has flags %#x, want a leaf", h.ID, h.Flags)
	}
	return h.ID, int(h.Count)
}

// makeStore creates a closed store at a new path with n records of about pad
// bytes each, and returns its path and records.
func makeStore(t testing.TB, n, pad int) (string, []*store.Record) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	s := open(t, path)
	var recs []*store.Record
	for i := range n {
		r := storetest.FullRecord(fmt.Sprintf("vol-%04d", i))
		r.Params["pad"] = strings.Repeat("p", pad)
		if err := s.Put(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Two empty transactions, so that both meta pages describe every record.
	for range 2 {
		rawUpdate(t, path, func(*bolt.Tx) error { return nil })
	}
	return path, recs
}

func wantRecords(t *testing.T, got, want []*store.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if diff := storetest.Diff(want[i], got[i]); diff != "" {
			t.Errorf("record %s: %s", want[i].VolumeID, diff)
		}
	}
}

// unchecked says what Open does without the check before bbolt maps the file:
// the protected open and walk alone.
type unchecked int

const (
	uncheckedCorrupt unchecked = iota // an error wrapping ErrCorrupt
	uncheckedOpens                    // bbolt opens the file
	uncheckedFails                    // another error
)

func TestOpenDamagedFile(t *testing.T) {
	tests := []struct {
		name    string
		records int // records (1KiB each) in the store before the damage
		damage  func(t *testing.T, b []byte) []byte
		// wantMsg is in the error; "" when the file opens with its records.
		wantMsg   string
		unchecked unchecked
	}{{
		name:      "empty file",
		records:   3,
		damage:    func(*testing.T, []byte) []byte { return nil },
		wantMsg:   "empty state file",
		unchecked: uncheckedOpens, // bbolt makes a new database of it
	}, {
		name:    "truncated to 16KiB",
		records: 500,
		damage: func(t *testing.T, b []byte) []byte {
			if len(b) <= 16<<10 {
				t.Fatalf("the store has only %d bytes", len(b))
			}
			return b[:16<<10]
		},
		wantMsg:   "it is truncated",
		unchecked: uncheckedCorrupt, // a SIGBUS reading past the end of the file
	}, {
		name:    "truncated to one page",
		records: 3,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, _ := fileLayout(b)
			return b[:ps]
		},
		wantMsg:   "less than its two",
		unchecked: uncheckedFails, // bbolt: file size too small
	}, {
		name:    "random bytes over meta page 0",
		records: 20,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, _ := fileLayout(b)
			fill(b[:ps], 1)
			return b
		},
		unchecked: uncheckedOpens,
	}, {
		name:    "both meta pages garbage",
		records: 3,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, _ := fileLayout(b)
			fill(b[:2*ps], 2)
			return b
		},
		wantMsg:   "neither meta page is valid",
		unchecked: uncheckedCorrupt, // bbolt: invalid database
	}, {
		name:    "root page flags",
		records: 20,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, m := fileLayout(b)
			h := headerAt(b, int(m.Root)*ps)
			h.Flags = 0x20
			putHeader(b, int(m.Root)*ps, h)
			return b
		},
		wantMsg:   "want a branch (0x1) or leaf (0x2) page",
		unchecked: uncheckedCorrupt, // bbolt's assertion on the page type
	}, {
		name:    "root page count",
		records: 20,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, m := fileLayout(b)
			h := headerAt(b, int(m.Root)*ps)
			h.Count = 0xFFFF
			putHeader(b, int(m.Root)*ps, h)
			return b
		},
		wantMsg:   "65535 elements do not fit",
		unchecked: uncheckedCorrupt,
	}, {
		name:    "volumes leaf page flags",
		records: 500,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, _ := fileLayout(b)
			id, _ := volumesLeaf(t, b)
			h := headerAt(b, int(id)*ps)
			h.Flags = branchFlag | leafFlag
			putHeader(b, int(id)*ps, h)
			return b
		},
		wantMsg:   `bucket "volumes": page`,
		unchecked: uncheckedCorrupt,
	}, {
		name:    "high-water mark past the end",
		records: 20,
		damage: func(t *testing.T, b []byte) []byte {
			ps, off, m := fileLayout(b)
			m.HWM = uint64(len(b)/ps) + 8
			putMeta(b, off, m)
			return b
		},
		wantMsg:   "it is truncated",
		unchecked: uncheckedOpens, // and writes past the mapping later
	}, {
		name:    "freelist not saved",
		records: 20,
		damage: func(t *testing.T, b []byte) []byte {
			_, off, m := fileLayout(b)
			m.Freelist = ^uint64(0)
			putMeta(b, off, m)
			return b
		},
		wantMsg:   "the freelist is not saved",
		unchecked: uncheckedOpens, // rebuilding the freelist on an unprotected goroutine
	}, {
		name:    "freelist page type",
		records: 20,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, m := fileLayout(b)
			h := headerAt(b, int(m.Freelist)*ps)
			h.Flags = leafFlag
			putHeader(b, int(m.Freelist)*ps, h)
			return b
		},
		wantMsg:   "want a freelist page",
		unchecked: uncheckedCorrupt, // bbolt panics inside its Open
	}, {
		name:    "freelist lists the root page",
		records: 20,
		damage: func(t *testing.T, b []byte) []byte {
			ps, _, m := fileLayout(b)
			off := int(m.Freelist) * ps
			h := headerAt(b, off)
			native.PutUint64(b[off+headerSize+int(h.Count)*8:], m.Root)
			h.Count++
			putHeader(b, off, h)
			return b
		},
		wantMsg:   "in use but also on the freelist",
		unchecked: uncheckedOpens, // and the next write frees a page twice and panics
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, recs := makeStore(t, tt.records, 1024)
			damaged := tt.damage(t, readFile(t, path))
			writeFile(t, path, damaged)

			s, err := boltstore.Open(path, boltstore.Options{Timeout: 100 * time.Millisecond})
			if tt.wantMsg == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				list, err := s.List(t.Context())
				if err != nil {
					t.Fatalf("List: %v", err)
				}
				wantRecords(t, list, recs)
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				if err == nil {
					s.Close()
					t.Fatal("Open of a damaged file succeeded")
				}
				t.Logf("Open: %v", err)
				if !errors.Is(err, boltstore.ErrCorrupt) {
					t.Errorf("error does not wrap ErrCorrupt")
				}
				for _, want := range []string{path, tt.wantMsg, "docs/operations.md, 'Damaged state'"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not contain %q", want)
					}
				}
				// The failed Open released the file: a second one finds the same damage.
				if _, err2 := boltstore.Open(path, boltstore.Options{Timeout: 100 * time.Millisecond}); !errors.Is(err2, boltstore.ErrCorrupt) {
					t.Errorf("second Open: %v, want ErrCorrupt", err2)
				}
			}

			// Inspect and Salvage read the same file without crashing either.
			_, ierr := boltstore.Inspect(path, boltstore.InspectOptions{Timeout: 100 * time.Millisecond})
			if got, want := errors.Is(ierr, boltstore.ErrCorrupt), tt.wantMsg != ""; got != want {
				t.Errorf("Inspect: %v, want ErrCorrupt %t", ierr, want)
			}
			if _, serr := boltstore.Salvage(path); serr != nil && !errors.Is(serr, boltstore.ErrCorrupt) {
				t.Errorf("Salvage: %v, want nil or ErrCorrupt", serr)
			}

			// Without the check, the protected open and walk still never crash.
			// Every run gets its own copy: a panic inside bbolt's Open leaks the
			// mapping, and with it the file lock.
			copyPath := filepath.Join(t.TempDir(), "state.db")
			writeFile(t, copyPath, damaged)
			s, err = boltstore.OpenUnchecked(copyPath, boltstore.Options{Timeout: 100 * time.Millisecond})
			t.Logf("Open without the check: %v", err)
			switch {
			case tt.unchecked == uncheckedOpens && err != nil:
				t.Errorf("Open without the check: %v, want success", err)
			case tt.unchecked == uncheckedCorrupt && !errors.Is(err, boltstore.ErrCorrupt):
				t.Errorf("Open without the check: %v, want ErrCorrupt", err)
			case tt.unchecked == uncheckedFails && (err == nil || errors.Is(err, boltstore.ErrCorrupt)):
				t.Errorf("Open without the check: %v, want another error", err)
			}
			if err == nil {
				s.Close()
			}
		})
	}
}

// fill overwrites b with random bytes from seed.
func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}
