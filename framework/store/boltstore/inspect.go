package boltstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ephemera-csi/ephemera/framework/store"
)

// InspectOptions configures [Inspect].
type InspectOptions struct {
	// Timeout is how long Inspect waits for a shared lock on the file, which it
	// cannot get while a driver has the store open. Defaults to 1s.
	Timeout time.Duration
}

// Report is what [Inspect] read from a state file.
type Report struct {
	// Path is the file inspected.
	Path string
	// Size is the file's size in bytes.
	Size int64
	// PageSize is bbolt's page size, and TxID the transaction ID of the meta page
	// in use; both 0 when neither meta page is valid.
	PageSize int
	TxID     uint64
	// SchemaVersion is the file's layout version (see [SchemaVersion]); 0 when it
	// could not be read, or the file has no buckets yet.
	SchemaVersion int
	// StoreID is the store's identity (see [Store.ID]); "" when it could not be
	// read or an older driver wrote the file.
	StoreID string
	// Writer is the program that last opened the file for writing, as
	// recorded from [Options].Writer; "" when none was recorded.
	Writer string
	// RecordCount is the number of entries in the "volumes" bucket, decodable or
	// not.
	RecordCount int
	// Records are the records that decode, ordered by volume ID.
	Records []*store.Record
	// Undecodable are the entries of "volumes" that do not decode, including
	// records of a newer version. A driver quarantines them (except newer ones,
	// which make it refuse the file) when it next opens the store.
	Undecodable []Entry
	// Quarantined are the entries of the "quarantine" bucket.
	Quarantined []Entry
}

// Entry is a raw entry of a bucket.
type Entry struct {
	// Key is the entry's key: the volume ID (in quarantine, "<id>#2", "<id>#3"...
	// for a volume quarantined more than once).
	Key string
	// Len is the length of the raw value in bytes.
	Len int
	// Head is the start of the raw value (up to 64 bytes), Go-quoted.
	Head string
	// Reason is why the value does not decode as a record.
	Reason string
}

// headLen is how much of a raw value an Entry shows.
const headLen = 64

func newEntry(k, v []byte) Entry {
	e := Entry{Key: string(k), Len: len(v), Head: strconv.Quote(string(v[:min(len(v), headLen)]))}
	if _, err := decode(string(k), v); err != nil {
		e.Reason = err.Error()
	}
	return e
}

// Inspect reads the state file at path for an operator, without changing it: it
// checks the file as [Open] does, then reads it through bbolt opened read-only,
// protected the same way. It returns a *Report and nil for a sound file.
//
// For a damaged file it returns an error wrapping [ErrCorrupt] together with a
// Report of what could still be read (see [Salvage]), or a nil Report when
// neither meta page is valid. While a driver has the store open it fails after
// Timeout with an error wrapping [ErrLocked]: a driver's lock is exclusive.
func Inspect(path string, opts InspectOptions) (*Report, error) {
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("boltstore: Timeout must not be negative, got %s", opts.Timeout)
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	f, err := openShared(path, opts.Timeout)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("boltstore: inspect %s: %w", path, err)
	}

	rep := &Report{Path: path, Size: fi.Size()}
	l, err := checkFile(f)
	if l != nil {
		rep.PageSize, rep.TxID = int(l.pageSize), l.meta.txid
	}
	if err == nil {
		err = protect(func() error { return inspectBolt(path, opts.Timeout, rep) })
	}
	if !isCorruption(err) {
		if err != nil {
			return nil, fmt.Errorf("boltstore: inspect %s: %v", path, err)
		}
		return rep, nil
	}
	if l == nil {
		return nil, corruptError(path, err)
	}
	// Read what the pages still give, without bbolt.
	rep = &Report{Path: path, Size: fi.Size(), PageSize: int(l.pageSize), TxID: l.meta.txid}
	c := &collector{rep: rep}
	_ = protect(func() error {
		_ = readLenient(f, l, c.add)
		return nil
	})
	c.finish()
	return rep, corruptError(path, err)
}

// inspectBolt fills rep from the file at path opened read-only by bbolt. bbolt
// takes a shared lock of its own, compatible with the one Inspect holds.
func inspectBolt(path string, timeout time.Duration, rep *Report) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: timeout})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		if err := walkAll(tx); err != nil {
			return err
		}
		meta, volumes := tx.Bucket(bucketMeta), tx.Bucket(bucketVolumes)
		if meta == nil && volumes == nil {
			return nil
		}
		if _, err := checkMeta(meta, volumes); err != nil && !errors.Is(err, store.ErrVersion) {
			return err
		}
		c := &collector{rep: rep}
		for _, name := range [][]byte{bucketMeta, bucketVolumes, bucketQuarantine} {
			if b := tx.Bucket(name); b != nil {
				_ = b.ForEach(func(k, v []byte) error {
					c.add(string(name), k, v)
					return nil
				})
			}
		}
		c.finish()
		return nil
	})
}

// Salvage reads whatever records can still be read from the file at path, for the
// framework to keep what it can (attribute hashes, pod names) of the volumes it
// rebuilds when [Open] found the file damaged. It never maps the file: it reads
// the pages of the "volumes" bucket with plain reads, skipping any page that is
// damaged, and returns the records that decode, ordered by volume ID.
//
// For a sound file the error is nil. Otherwise it wraps [ErrCorrupt] and says what
// was skipped; the records returned are still good. When neither meta page is
// valid there is no tree to read and Salvage returns no records. It fails with an
// error wrapping [ErrLocked] while a driver has the store open (waiting 1s).
func Salvage(path string) ([]*store.Record, error) {
	f, err := openShared(path, time.Second)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("boltstore: salvage %s: %w", path, err)
	}
	c := &collector{rep: &Report{}}
	var problems []string
	err = protect(func() error {
		l, err := readLayout(f, fi.Size())
		if err != nil {
			return err
		}
		problems = readLenient(f, l, func(bucket string, k, v []byte) {
			if bucket == string(bucketVolumes) {
				c.add(bucket, k, v)
			}
		})
		return nil
	})
	c.finish()
	switch {
	case err != nil && !isCorruption(err):
		return nil, fmt.Errorf("boltstore: salvage %s: %v", path, err)
	case err != nil:
		return c.rep.Records, corruptError(path, err)
	case len(problems) > 0:
		return c.rep.Records, corruptError(path, errors.New(summary(problems)))
	}
	return c.rep.Records, nil
}

// openShared opens path read-only and takes a shared lock on it, failing with
// ErrLocked after timeout.
func openShared(path string, timeout time.Duration) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	if err := lockFile(f, false, timeout); err != nil {
		_ = f.Close()
		if errors.Is(err, errLockTimeout) {
			return nil, lockedError(path, timeout, "a driver has the store open: stop the driver or use the live listing")
		}
		return nil, fmt.Errorf("boltstore: lock %s: %v", path, err)
	}
	return f, nil
}

// readLenient reads the "meta", "volumes" and "quarantine" buckets of the file
// page by page, passing each entry to add and skipping what it cannot read, and
// returns the problems it found.
func readLenient(f *os.File, l *layout, add func(bucket string, k, v []byte)) []string {
	w := &walker{r: f, l: l, seen: make(map[uint64]bool)}
	_ = w.walkTree("", l.meta.root, nil, func(k, v []byte, isBucket bool) error {
		if !isBucket {
			return nil
		}
		for _, name := range [][]byte{bucketMeta, bucketVolumes, bucketQuarantine} {
			if bytes.Equal(k, name) {
				return w.walkBucket(fmt.Sprintf("%q", k), v, func(k, v []byte, isBucket bool) error {
					if !isBucket {
						add(string(name), k, v)
					}
					return nil
				})
			}
		}
		return nil
	})
	return w.problems
}

// collector builds a Report from the entries of the store's buckets.
type collector struct {
	rep              *Report
	schemaRaw, idRaw []byte
}

func (c *collector) add(bucket string, k, v []byte) {
	switch bucket {
	case string(bucketMeta):
		switch {
		case bytes.Equal(k, keySchema):
			c.schemaRaw = bytes.Clone(v)
		case bytes.Equal(k, keyStoreID):
			c.idRaw = bytes.Clone(v)
		case bytes.Equal(k, keyWriter):
			c.rep.Writer = string(v)
		}
	case string(bucketVolumes):
		c.rep.RecordCount++
		if r, err := decode(string(k), v); err == nil {
			c.rep.Records = append(c.rep.Records, r)
		} else {
			c.rep.Undecodable = append(c.rep.Undecodable, newEntry(k, v))
		}
	case string(bucketQuarantine):
		c.rep.Quarantined = append(c.rep.Quarantined, newEntry(k, v))
	}
}

// finish sets the report's schema version and store ID where they parse.
func (c *collector) finish() {
	if v, err := parseSchema(c.schemaRaw); err == nil {
		c.rep.SchemaVersion = v
	}
	if id, err := parseStoreID(c.idRaw); err == nil {
		c.rep.StoreID = id
	}
	slices.SortFunc(c.rep.Records, func(a, b *store.Record) int { return strings.Compare(a.VolumeID, b.VolumeID) })
}
