package boltstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/ephemera-csi/ephemera/framework/store"
)

// TestCheckFileAcceptsBboltFiles guards against false alarms, which would make
// the framework throw away a healthy state file: files that bbolt writes through
// many transactions of puts and deletes, small and large (overflow) values, and
// nested and inline buckets, all pass checkFile, and bbolt's own tx.Check agrees
// that they are sound.
func TestCheckFileAcceptsBboltFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "c"}
	value := func() []byte {
		n := r.IntN(200)
		if r.IntN(10) == 0 {
			n = r.IntN(3 * os.Getpagesize()) // overflow pages
		}
		return []byte(strings.Repeat("v", n))
	}
	for round := range 60 {
		db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			err := db.Update(func(tx *bolt.Tx) error {
				for range 40 {
					top, err := tx.CreateBucketIfNotExists([]byte(names[r.IntN(len(names))]))
					if err != nil {
						return err
					}
					b := top
					if r.IntN(3) == 0 { // a nested bucket, often small enough to be inline
						if b, err = top.CreateBucketIfNotExists(fmt.Appendf(nil, "sub-%d", r.IntN(4))); err != nil {
							return err
						}
					}
					key := fmt.Appendf(nil, "key-%04d", r.IntN(2000))
					switch op := r.IntN(10); {
					case op < 6:
						err = b.Put(key, value())
					case op < 9:
						err = b.Delete(key)
					default:
						if err = top.DeleteBucket(fmt.Appendf(nil, "sub-%d", r.IntN(4))); errors.Is(err, berrors.ErrBucketNotFound) {
							err = nil
						}
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		var problems []error
		_ = db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				problems = append(problems, err)
			}
			return nil
		})
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if len(problems) > 0 {
			t.Fatalf("round %d: bbolt finds its own file unsound: %v", round, problems)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = checkFile(f)
		f.Close()
		if err != nil {
			t.Fatalf("round %d: checkFile: %v", round, err)
		}
	}
	fi, _ := os.Stat(path)
	t.Logf("final file: %d bytes", fi.Size())
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want error // nil: decodes
	}{
		{"record", `{"version":1,"volumeID":"vol-a","phase":"Published"}`, nil},
		{"older version", `{"version":0,"volumeID":"vol-a"}`, nil},
		{"newer version", `{"version":2,"volumeID":"vol-a","pod":7}`, store.ErrVersion},
		{"not JSON", `{"version":1,`, store.ErrUndecodable},
		{"empty", ``, store.ErrUndecodable},
		{"wrong shape", `{"version":1,"volumeID":"vol-a","pod":7}`, store.ErrUndecodable},
		{"another volume", `{"version":1,"volumeID":"vol-b"}`, store.ErrUndecodable},
		{"no volume ID", `{"version":1}`, store.ErrUndecodable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := decode("vol-a", []byte(tt.raw))
			if tt.want == nil {
				if err != nil || r.VolumeID != "vol-a" {
					t.Errorf("decode = %+v, %v; want the record", r, err)
				}
				return
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), `"vol-a"`) {
				t.Errorf("decode error = %v, want %v naming vol-a", err, tt.want)
			}
		})
	}
}
