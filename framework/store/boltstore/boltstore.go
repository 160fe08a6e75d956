package boltstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/ephemera-csi/ephemera/framework/store"
)

// SchemaVersion is the version of the file layout (buckets and key encoding) this
// package writes into the "meta" bucket. It is independent of [store.RecordVersion],
// which versions the records themselves.
const SchemaVersion = 1

// ErrLocked is returned by [Open] when another process holds the file's lock for
// longer than [Options].Timeout, and by [Inspect] and [Salvage] while a driver has
// the store open.
var ErrLocked = errors.New("state store is locked")

// ErrCorrupt is returned by [Open], [Inspect] and [Salvage] for a damaged file: a
// truncated or empty file, invalid meta pages, pages that do not form a sound
// tree, or a panic or memory fault in bbolt while reading the file. The message
// names the file and what is wrong with it. Such a file cannot be repaired; the
// framework moves it aside and rebuilds the state from the node.
var ErrCorrupt = errors.New("state file is damaged")

// errLockTimeout is returned by lockFile when the lock stays taken.
var errLockTimeout = errors.New("timed out waiting for the file lock")

// lockRetry is how often lockFile tries the lock again, as bbolt does.
const lockRetry = 50 * time.Millisecond

var (
	bucketVolumes    = []byte("volumes")
	bucketMeta       = []byte("meta")
	bucketQuarantine = []byte("quarantine")
	keySchema        = []byte("schemaVersion")
	keyStoreID       = []byte("storeID")
	keyWriter        = []byte("writer")
)

// Options configures [Open].
type Options struct {
	// Timeout is how long Open waits for the file's exclusive lock before failing
	// with ErrLocked. Defaults to 1s.
	Timeout time.Duration

	// Writer names the program that opens the file, e.g.
	// "scratch.csi.ephemera.dev v0.4.0". Open records it in the "meta" bucket
	// when it differs from the one recorded there, so that an older driver that
	// refuses the file (see [store.ErrVersion]) can say which version wrote
	// it. Defaults to "" (nothing recorded, and the recorded one is kept).
	Writer string

	// skipCheck skips checkFile, for tests of what the protected open does
	// alone.
	skipCheck bool
}

func (o *Options) setDefaults() {
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
}

func (o *Options) validate() error {
	if o.Timeout < 0 {
		return fmt.Errorf("boltstore: Timeout must not be negative, got %s", o.Timeout)
	}
	return nil
}

// Store is a [store.Store] backed by a bbolt file. It is safe for concurrent use.
type Store struct {
	db          *bolt.DB
	path        string
	id          string
	quarantined []string
	group       groupCommit // Puts and Deletes waiting for a commit
	records     records     // what Get reads
}

// records holds up to cachedRecords records of the file, decoded, in step
// with it: Open fills it with records it decoded anyway, and each Put and
// Delete changes it once its commit succeeded, in the order of the commits
// (only one leader commits at a time, and it applies its batch before it
// hands over). A Get of a record it holds is a map lookup and a copy instead
// of a read transaction and a JSON decode, which were a third of the
// store's share of a publish and unpublish (docs/design.md, "Durability");
// any other Get reads the file. List always reads the file, so that damage
// that appears while the store is open is still found there.
type records struct {
	mu sync.RWMutex
	m  map[string]*store.Record // nil once the store is closed
}

// cachedRecords bounds records: every volume of a node that runs 110 pods
// with two inline volumes each, and a small, fixed share of the heap however
// many volumes there are (issue 11's RSS bounds; docs/operations.md, "Memory
// and CPU of the driver", has the numbers).
const cachedRecords = 256

// get returns a copy of record id if it holds it; ok is false when the store
// is closed.
func (r *records) get(id string) (rec *store.Record, held, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.m == nil {
		return nil, false, false
	}
	rec, held = r.m[id]
	if held {
		rec = rec.Clone()
	}
	return rec, held, true
}

// set records what a committed write left for id: rec, or nothing when rec
// is nil. When full it drops another record (whichever the map's iteration
// yields first), which Get then reads from the file.
func (r *records) set(id string, rec *store.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.m == nil:
	case rec == nil:
		delete(r.m, id)
	default:
		if _, held := r.m[id]; !held && len(r.m) >= cachedRecords {
			for other := range r.m {
				delete(r.m, other)
				break
			}
		}
		r.m[id] = rec
	}
}

// close drops the records: Get fails from then on.
func (r *records) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m = nil
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Relaxed = (*Store)(nil)
)

// Open opens the store at path, creating the file and its parent directory (mode
// 0700) when missing.
//
// Before bbolt maps an existing file, Open checks its structure with plain reads,
// then reads every bucket and key through bbolt on a goroutine that turns memory
// faults and bbolt's panics into errors: whatever the file holds, Open returns an
// error wrapping [ErrCorrupt] rather than crashing. Records that do not decode are
// moved to the "quarantine" bucket (see [Store.Quarantined]).
//
// Open fails with an error wrapping [ErrLocked] when another process holds the
// file, and with one wrapping [store.ErrVersion] when the file or one of its
// records was written by a newer driver.
func Open(path string, opts Options) (*Store, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("boltstore: empty path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: create state directory: %v", err)
	}
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		if err := create(path, opts.Timeout); err != nil {
			return nil, fmt.Errorf("boltstore: create %s: %v", path, err)
		}
	}

	var (
		db   *bolt.DB
		file *os.File
		got  loaded
	)
	err := protect(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{
			Timeout: opts.Timeout,
			// bbolt opens the file through this hook before it locks and maps it:
			// lock it here and check it while nothing is mapped yet.
			OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
				f, err := openChecked(name, flag&^os.O_CREATE, perm, opts.Timeout, !opts.skipCheck)
				file = f
				return f, err
			},
		})
		if err != nil {
			return err
		}
		got, err = load(db, opts.Writer)
		return err
	})
	if err != nil {
		if db != nil {
			_ = db.Close()
		} else if file != nil {
			// bbolt's Open failed, and closed the file (closing it again is
			// harmless), or it panicked, which checkFile should make impossible:
			// then the mapping bbolt made is lost and keeps the file locked until
			// the process exits. A new file at path is not affected.
			_ = file.Close()
		}
		return nil, openError(path, opts.Timeout, err)
	}
	return &Store{db: db, path: path, id: got.id, quarantined: got.quarantined, records: records{m: got.records}}, nil
}

// openError turns an error of Open into one that names path and says what to do.
func openError(path string, timeout time.Duration, err error) error {
	switch {
	case errors.Is(err, ErrLocked), errors.Is(err, ErrCorrupt):
		return err // from openChecked, which names the file
	case errors.Is(err, berrors.ErrTimeout):
		return lockedError(path, timeout, "another driver process (e.g. a second DaemonSet pod on this node) holds it")
	case errors.Is(err, store.ErrVersion):
		return fmt.Errorf("boltstore: %s: %w", path, err) // load says what to do
	case isCorruption(err):
		return corruptError(path, err)
	default:
		return fmt.Errorf("boltstore: open %s: %v", path, err)
	}
}

// isCorruption reports whether err says that the file is damaged: a *damage from
// the checks, a panic or fault in bbolt, or bbolt's own verdict on the meta pages.
func isCorruption(err error) bool {
	var perr *panicError
	return isDamage(err) || errors.As(err, &perr) ||
		errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrVersionMismatch) || errors.Is(err, berrors.ErrChecksum)
}

func lockedError(path string, timeout time.Duration, who string) error {
	return fmt.Errorf("%w: %s: gave up waiting %s for the file lock; %s", ErrLocked, path, timeout, who)
}

func corruptError(path string, err error) error {
	return fmt.Errorf("%w: %s: %v; move it aside to rebuild the state from the node (see docs/operations.md, 'Damaged state')",
		ErrCorrupt, path, err)
}

// openChecked opens the existing file name, takes bbolt's exclusive lock on it and
// checks its structure with checkFile (when check is set). The file is returned
// open and, where the platform allows (see handOver), still locked.
func openChecked(name string, flag int, perm os.FileMode, timeout time.Duration, check bool) (*os.File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
		}
	}()
	if err := lockFile(f, true, timeout); errors.Is(err, errLockTimeout) {
		return nil, lockedError(name, timeout, "another driver process (e.g. a second DaemonSet pod on this node) holds it")
	} else if err != nil {
		return nil, fmt.Errorf("lock %s: %v", name, err)
	}
	if check {
		if _, err := checkFile(f); isDamage(err) {
			return nil, corruptError(name, err)
		} else if err != nil {
			return nil, fmt.Errorf("check %s: %v", name, err)
		}
	}
	if err := handOver(f); err != nil {
		return nil, fmt.Errorf("unlock %s: %v", name, err)
	}
	ok = true
	return f, nil
}

// create makes a new store file at path. bbolt initialises a temporary file next
// to it, which is then hard-linked to path unless path exists by then (another
// process created it first; Open then opens that one). So a file at path always
// has its meta pages, and an empty file at path is damage, not a file being
// created.
func create(path string, timeout time.Duration) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".new-*")
	if err != nil {
		return err
	}
	name := tmp.Name()
	defer os.Remove(name)
	if err := tmp.Close(); err != nil {
		return err
	}
	db, err := bolt.Open(name, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	if err := os.Link(name, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(dir)
}

// loaded is what load found in a file.
type loaded struct {
	id          string
	writer      string // the "writer" recorded in the file, "" for none
	quarantined []string
	records     map[string]*store.Record // up to cachedRecords of the records that decoded
}

// badRecord is a record that does not decode.
type badRecord struct {
	id  string
	raw []byte
}

// load reads every bucket and key of db (so that damage shows now, as a fault or
// a bbolt panic inside protect, and not in a later call), checks the schema,
// decodes every record, and then, only when something needs writing, initialises
// the buckets and the store ID, records writer, and moves undecodable records to
// quarantine. A file or record of a newer version is refused with an error that
// names the versions, the writer recorded in the file and the ways out.
func load(db *bolt.DB, writer string) (loaded, error) {
	var (
		got   = loaded{records: map[string]*store.Record{}}
		fresh bool // no buckets yet
		bad   []badRecord
	)
	err := db.View(func(tx *bolt.Tx) error {
		if err := walkAll(tx); err != nil {
			return err
		}
		meta, volumes := tx.Bucket(bucketMeta), tx.Bucket(bucketVolumes)
		if meta == nil && volumes == nil {
			fresh = true
			return nil
		}
		if meta != nil {
			got.writer = string(meta.Get(keyWriter))
		}
		var err error
		if got.id, err = checkMeta(meta, volumes); err != nil {
			return err
		}
		return volumes.ForEach(func(k, v []byte) error {
			r, err := decode(string(k), v)
			switch {
			case errors.Is(err, store.ErrVersion):
				return err
			case err != nil:
				bad = append(bad, badRecord{id: string(k), raw: bytes.Clone(v)})
			case len(got.records) < cachedRecords:
				got.records[r.VolumeID] = r
			}
			return nil
		})
	})
	if errors.Is(err, store.ErrVersion) {
		by := "a newer driver"
		if got.writer != "" {
			by = strconv.Quote(got.writer)
		}
		this := "this driver"
		if writer != "" {
			this = strconv.Quote(writer)
		}
		return got, fmt.Errorf("%w; the file was last opened by %s and %s cannot read it: downgrades of the state file are not supported. "+
			"Run that version (or a newer one) again, or, to downgrade anyway, stop the driver and move the file aside: the older driver then rebuilds the state from the node "+
			"(docs/operations.md, 'Versions and the state file')", err, by, this)
	}
	if err != nil {
		return got, err
	}
	if !fresh && got.id != "" && len(bad) == 0 && (writer == "" || writer == got.writer) {
		return got, nil
	}
	if got.id == "" {
		got.id = newID()
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		volumes, err := tx.CreateBucketIfNotExists(bucketVolumes)
		if err != nil {
			return err
		}
		if fresh {
			if err := meta.Put(keySchema, []byte(strconv.Itoa(SchemaVersion))); err != nil {
				return err
			}
		}
		if err := meta.Put(keyStoreID, []byte(got.id)); err != nil {
			return err
		}
		if writer != "" && writer != got.writer {
			if err := meta.Put(keyWriter, []byte(writer)); err != nil {
				return err
			}
		}
		if len(bad) == 0 {
			return nil
		}
		q, err := tx.CreateBucketIfNotExists(bucketQuarantine)
		if err != nil {
			return err
		}
		for _, r := range bad {
			if err := q.Put(quarantineKey(q, r.id), r.raw); err != nil {
				return err
			}
			if err := volumes.Delete([]byte(r.id)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return got, err
	}
	for _, r := range bad {
		got.quarantined = append(got.quarantined, r.id)
	}
	return got, nil
}

// checkMeta checks the "meta" bucket of a file that has buckets, and returns its
// store ID ("" when an older driver wrote the file). Both buckets are created in
// one transaction, so a file with only one of them is damaged.
func checkMeta(meta, volumes *bolt.Bucket) (string, error) {
	if meta == nil {
		return "", damagef("the %q bucket is missing while %q exists", bucketMeta, bucketVolumes)
	}
	if volumes == nil {
		return "", damagef("the %q bucket is missing while %q exists", bucketVolumes, bucketMeta)
	}
	v, err := parseSchema(meta.Get(keySchema))
	if err != nil {
		return "", err
	}
	if v > SchemaVersion {
		return "", fmt.Errorf("%w: file schema %d, this driver knows %d", store.ErrVersion, v, SchemaVersion)
	}
	return parseStoreID(meta.Get(keyStoreID))
}

func parseSchema(raw []byte) (int, error) {
	if raw == nil {
		return 0, damagef("the schema version is missing from the %q bucket", bucketMeta)
	}
	v, err := strconv.Atoi(string(raw))
	if err != nil || v < 1 {
		return 0, damagef("the schema version %q is not a positive number", raw)
	}
	return v, nil
}

// parseStoreID returns a stored ID, "" for none.
func parseStoreID(raw []byte) (string, error) {
	if raw == nil {
		return "", nil
	}
	if b, err := hex.DecodeString(string(raw)); err != nil || len(b) != idBytes || strings.ToLower(string(raw)) != string(raw) {
		return "", damagef("the store ID %q is not %d lower-case hex digits", raw, 2*idBytes)
	}
	return string(raw), nil
}

// idBytes is the size of a store ID: 128 random bits.
const idBytes = 16

func newID() string {
	b := make([]byte, idBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// quarantineKey returns the key under which to quarantine the record of id: id
// itself, or "id#2", "id#3"... when that record was quarantined before, so that
// nothing in quarantine is ever overwritten.
func quarantineKey(q *bolt.Bucket, id string) []byte {
	key := []byte(id)
	for n := 2; q.Get(key) != nil; n++ {
		key = fmt.Appendf(nil, "%s#%d", id, n)
	}
	return key
}

// walkAll reads every key and value of every bucket of tx through bbolt's cursors,
// so that a fault or an assertion on a damaged page happens now.
func walkAll(tx *bolt.Tx) error {
	var sum uint32 // the bytes must be read, not just sliced
	var walk func(b *bolt.Bucket, depth int) error
	walk = func(b *bolt.Bucket, depth int) error {
		if depth > maxDepth {
			return damagef("buckets are nested more than %d levels deep", maxDepth)
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			sum = crc32.Update(sum, crc32.IEEETable, k)
			sum = crc32.Update(sum, crc32.IEEETable, v)
			if v != nil {
				continue
			}
			if sub := b.Bucket(k); sub != nil {
				if err := walk(sub, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(tx.Cursor().Bucket(), 0)
}

// ID returns the store's identity: 32 hex digits, random, written into the file
// when it is created (or when an older driver's file is first opened). A new file
// is a new identity. See the package documentation.
func (s *Store) ID() string { return s.id }

// Quarantined returns the IDs of the records that this Open moved to the
// "quarantine" bucket because they did not decode, in key order; nil when none.
// The framework rebuilds those volumes from the node. A later Open does not
// return them again.
func (s *Store) Quarantined() []string { return slices.Clone(s.quarantined) }

// Path returns the path of the bbolt file.
func (s *Store) Path() string { return s.path }

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, id string) (*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r, held, ok := s.records.get(id); !ok {
		return nil, fmt.Errorf("boltstore: get: %w", berrors.ErrDatabaseNotOpen)
	} else if held {
		return r, nil
	}
	var r *store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketVolumes).Get([]byte(id))
		if raw == nil {
			return fmt.Errorf("%w: %q", store.ErrNotFound, id)
		}
		var err error
		r, err = decode(id, raw)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: get: %w", err)
	}
	return r, nil
}

// Put implements [store.Store]. It sets r.Version to [store.RecordVersion] and is
// durable when it returns; concurrent calls share one transaction.
func (s *Store) Put(ctx context.Context, r *store.Record) error { return s.put(ctx, r, true) }

// PutRelaxed implements [store.Relaxed]: Put without waiting for the disk.
func (s *Store) PutRelaxed(ctx context.Context, r *store.Record) error { return s.put(ctx, r, false) }

func (s *Store) put(ctx context.Context, r *store.Record, durable bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r == nil {
		return errors.New("boltstore: put: nil record")
	}
	if r.VolumeID == "" {
		return errors.New("boltstore: put: empty volume ID")
	}
	r.Version = store.RecordVersion
	raw, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("boltstore: put %q: encode: %v", r.VolumeID, err)
	}
	key := []byte(r.VolumeID)
	// The group commit may run the function twice (again alone, after its
	// group failed); it only writes prepared bytes.
	err = s.write(durable, r.VolumeID, r.Clone(), func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Put(key, raw)
	})
	if err != nil {
		return fmt.Errorf("boltstore: put %q: %w", r.VolumeID, err)
	}
	return nil
}

// RelaxedSyncInterval bounds how long a relaxed write ([Store.PutRelaxed],
// [Store.DeleteRelaxed]) stays in the page cache only: a power loss loses at
// most this much of them.
const RelaxedSyncInterval = time.Second

// write commits fn, durably or relaxed, in a group commit: a writer that finds
// no commit in progress commits at once, with whatever is queued; writers that
// arrive while a commit runs queue up and go together in the next one, led by
// the first of them. Nobody waits for a timer (bbolt's Batch waits
// MaxBatchDelay for company, and a commit is so short that the delay was most
// of a write's latency: docs/design.md, "Durability"), and a burst still
// shares one transaction, and its
// fsyncs, per round. A commit of relaxed writes only skips bbolt's fdatasyncs;
// the next durable commit's fdatasync, or a sync at most RelaxedSyncInterval
// later, takes them to the disk.
//
// rec is what the write leaves for id (nil: nothing), for s.records once it
// is committed. A failed write drops the record from s.records, and Get reads
// it from the file: a commit that failed after its meta page was written is
// in the file all the same.
func (s *Store) write(durable bool, id string, rec *store.Record, fn func(*bolt.Tx) error) error {
	return s.group.write(s.db, &groupWrite{fn: fn, durable: durable, settle: func(err error) {
		if err != nil {
			rec = nil
		}
		s.records.set(id, rec)
	}})
}

// groupCommit queues writes for one leader at a time.
type groupCommit struct {
	mu      sync.Mutex
	leading bool          // a leader is committing or about to
	queue   []*groupWrite // writes for the next commit

	// unsynced is set after a relaxed commit and cleared by the next fdatasync;
	// syncTimer runs that sync when no durable commit comes first. syncing
	// counts the timer's syncs in progress, which run without mu so that the
	// writers never wait for the disk; close waits for them (synced).
	unsynced  bool
	syncTimer *time.Timer
	syncing   int
	synced    sync.WaitGroup
	closed    bool

	beforeSync func() // tests: runs in syncRelaxed before its fdatasync
}

type groupWrite struct {
	fn      func(*bolt.Tx) error
	durable bool
	settle  func(err error) // run by the leader once the write's fate is known, in commit order
	err     error
	done    chan struct{} // closed when err is set
	lead    chan struct{} // closed to make this write's caller the next leader
}

func (g *groupCommit) write(db *bolt.DB, w *groupWrite) error {
	w.done, w.lead = make(chan struct{}), make(chan struct{})
	g.mu.Lock()
	g.queue = append(g.queue, w)
	if g.leading {
		g.mu.Unlock()
		select {
		case <-w.done:
			return w.err
		case <-w.lead: // the previous leader handed over; w is still queued
		}
	} else {
		g.leading = true
		g.mu.Unlock()
	}

	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()
	anyDurable := slices.ContainsFunc(batch, func(w *groupWrite) bool { return w.durable })
	// Only the leader commits, so NoSync is this commit's alone.
	db.NoSync = !anyDurable
	commitGroup(db, batch) // includes w
	db.NoSync = false
	g.mu.Lock()
	g.committed(db, anyDurable)
	if len(g.queue) > 0 {
		close(g.queue[0].lead)
	} else {
		g.leading = false
	}
	g.mu.Unlock()
	return w.err
}

// committed records a commit (g.mu held): a durable one synced everything
// before it; a relaxed one is synced within RelaxedSyncInterval.
func (g *groupCommit) committed(db *bolt.DB, durable bool) {
	if durable {
		g.unsynced = false
		return
	}
	if g.unsynced || g.closed {
		return
	}
	g.unsynced = true
	g.syncTimer = time.AfterFunc(RelaxedSyncInterval, func() { g.syncRelaxed(db) })
}

// syncRelaxed takes the relaxed commits to the disk, without holding mu
// during the fdatasync: writers go on committing meanwhile, and one that
// commits relaxed after unsynced was cleared arms the next timer. An error
// shows again at the next durable commit.
func (g *groupCommit) syncRelaxed(db *bolt.DB) {
	g.mu.Lock()
	if !g.unsynced || g.closed {
		g.mu.Unlock()
		return
	}
	g.unsynced = false
	g.syncing++
	g.synced.Add(1)
	g.mu.Unlock()
	if g.beforeSync != nil {
		g.beforeSync()
	}
	_ = db.Sync()
	g.mu.Lock()
	g.syncing--
	g.mu.Unlock()
	g.synced.Done()
}

// close syncs what relaxed commits left unsynced and stops the timer; the
// group takes no timer after it, and close returns once a sync the timer
// started has finished.
func (g *groupCommit) close(db *bolt.DB) error {
	g.mu.Lock()
	g.closed = true
	if g.syncTimer != nil {
		g.syncTimer.Stop()
	}
	unsynced := g.unsynced
	g.unsynced = false
	g.mu.Unlock()
	g.synced.Wait()
	if !unsynced {
		return nil
	}
	return db.Sync()
}

// commitGroup commits batch in one transaction; when that fails, each write is
// committed alone, so that one write's error (or a bad record) is its own
// and the others still land. Every write of batch is done when it returns.
func commitGroup(db *bolt.DB, batch []*groupWrite) {
	finish := func(w *groupWrite, err error) {
		if w.settle != nil {
			w.settle(err)
		}
		w.err = err
		close(w.done)
	}
	// Not protect()ed: a panic in a commit (a fault of the mapping) ends the
	// process, as before; its followers go with it.
	err := db.Update(func(tx *bolt.Tx) error {
		for _, w := range batch {
			if err := w.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(batch) == 1 {
		for _, w := range batch {
			finish(w, err)
		}
		return
	}
	for _, w := range batch {
		finish(w, db.Update(w.fn))
	}
}

// Delete implements [store.Store]. Deleting an unknown ID is not an error.
func (s *Store) Delete(ctx context.Context, id string) error { return s.delete(ctx, id, true) }

// DeleteRelaxed implements [store.Relaxed]: Delete without waiting for the disk.
func (s *Store) DeleteRelaxed(ctx context.Context, id string) error { return s.delete(ctx, id, false) }

func (s *Store) delete(ctx context.Context, id string, durable bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if id == "" {
		// bbolt refuses empty keys; no record can have one.
		return nil
	}
	key := []byte(id)
	err := s.write(durable, id, nil, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Delete(key)
	})
	if err != nil {
		return fmt.Errorf("boltstore: delete %q: %w", id, err)
	}
	return nil
}

// List implements [store.Store]. Records come back ordered by volume ID (bbolt keeps
// keys in byte order, which is Go's string order). A record that does not decode
// fails the whole List with an error wrapping [store.ErrUndecodable] (or
// [store.ErrVersion]) that names it: Open quarantines such records, so this only
// happens for damage that appeared while the store was open, and reopening the
// store quarantines it.
func (s *Store) List(ctx context.Context) ([]*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*store.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).ForEach(func(k, v []byte) error {
			r, err := decode(string(k), v)
			if err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: list: %w", err)
	}
	return out, nil
}

// Close implements [store.Store]. It is idempotent; later calls on the store fail
// with an error wrapping bbolt's ErrDatabaseNotOpen.
func (s *Store) Close() error {
	s.records.close()
	serr := s.group.close(s.db)
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("boltstore: close %s: %v", s.path, err)
	}
	if serr != nil {
		return fmt.Errorf("boltstore: close %s: syncing relaxed writes: %v", s.path, serr)
	}
	return nil
}

// decode parses one stored record, refusing newer record versions before looking at
// the rest of the document (whose shape may have changed). A record that does not
// parse, or is stored under another volume's ID, is undecodable.
func decode(id string, raw []byte) (*store.Record, error) {
	version, ok := leadingVersion(raw)
	if !ok || version > store.RecordVersion {
		// The slow way, also for a newer version: that is then refused for
		// what a full decode of the document says, as before.
		var head struct {
			Version int `json:"version"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return nil, fmt.Errorf("%w: %q: %v", store.ErrUndecodable, id, err)
		}
		version = head.Version
	}
	if version > store.RecordVersion {
		return nil, fmt.Errorf("%w: record %q has version %d, this driver knows %d",
			store.ErrVersion, id, version, store.RecordVersion)
	}
	r := new(store.Record)
	if err := json.Unmarshal(raw, r); err != nil {
		return nil, fmt.Errorf("%w: %q: %v", store.ErrUndecodable, id, err)
	}
	if r.VolumeID != id {
		return nil, fmt.Errorf("%w: %q: the record is for volume %q", store.ErrUndecodable, id, r.VolumeID)
	}
	return r, nil
}

// versionKey is how every record put writes begins: json.Marshal of a
// store.Record, whose first field is its version.
var versionKey = []byte(`{"version":`)

// leadingVersion reads the version of a record in the shape put writes it,
// `{"version":N,...` with "version" once in the document, without decoding
// the rest: decode's first pass, which otherwise unmarshals the whole
// document once more. ok is false for any other shape (whitespace, another
// key order, a second "version" key anywhere, a number that is not a plain
// non-negative int): decode then reads the version the slow way, as it does
// for a version newer than this driver's, with the same result.
func leadingVersion(raw []byte) (version int, ok bool) {
	rest, found := bytes.CutPrefix(raw, versionKey)
	if !found || bytes.Contains(rest, versionKey[1:]) {
		return 0, false
	}
	i := 0
	for ; i < len(rest) && i < 9 && '0' <= rest[i] && rest[i] <= '9'; i++ {
		version = version*10 + int(rest[i]-'0')
	}
	if i == 0 || i == len(rest) || (rest[i] != ',' && rest[i] != '}') || (rest[0] == '0' && i > 1) {
		return 0, false
	}
	return version, true
}
