package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"strings"
)

// The on-disk format of a bbolt file as go.etcd.io/bbolt v1.4 writes it (see its
// internal/common/meta.go, page.go and bucket.go). Integers are in the machine's
// byte order, as bbolt casts pages to structs.
const (
	boltMagic   = 0xED0CDAED
	boltVersion = 2

	// A page starts with a header: id uint64, flags uint16, count uint16,
	// overflow uint32 (the number of further pages the page spans).
	pageHeaderSize = 16
	// The meta follows the header of pages 0 and 1: magic, version, pageSize,
	// flags uint32; the root bucket {root pgid, sequence uint64}; freelist pgid,
	// pgid high-water mark, txid, checksum uint64.
	metaSize = 64
	// The checksum is FNV-64a over the meta bytes before it.
	metaSummed = 56
	// Branch elements are pos, ksize uint32, pgid uint64; leaf elements are flags,
	// pos, ksize, vsize uint32. pos is relative to the element itself.
	elemSize = 16
	// A bucket's value starts with {root pgid, sequence uint64}; root 0 means an
	// inline bucket whose leaf page follows in the value.
	bucketHeaderSize = 16

	branchPage   = 0x01
	leafPage     = 0x02
	freelistPage = 0x10
	bucketLeaf   = 0x01 // leaf element flag: the value is a bucket

	// noFreelist is the freelist pgid of a file whose freelist is not saved.
	noFreelist = ^uint64(0)
	// freelistLong is the count of a freelist page whose real count is its first
	// element.
	freelistLong = 0xFFFF

	// bbolt looks for the second meta page at 1KiB to 16MiB.
	minPageSize = 1024
	maxPageSize = 1 << 24
	// maxDepth bounds tree and bucket nesting; real files are a few levels deep.
	maxDepth = 64
)

var order = binary.NativeEndian

// damage is a description of what is wrong with a file's contents, as opposed to
// an error reading it. Open turns it into an error wrapping ErrCorrupt.
type damage struct{ msg string }

func (d *damage) Error() string { return d.msg }

func damagef(format string, args ...any) error {
	return &damage{msg: fmt.Sprintf(format, args...)}
}

func isDamage(err error) bool {
	var d *damage
	return errors.As(err, &d)
}

// meta is a decoded meta page.
type meta struct {
	magic, version, pageSize uint32
	root, freelist, hwm      uint64
	txid, checksum           uint64
}

// parseMeta decodes the meta page at the start of b (at least
// pageHeaderSize+metaSize bytes) and validates it as bbolt's Meta.Validate does.
// The decoded fields are returned even when it is invalid (bbolt compares txids
// of invalid metas too).
func parseMeta(b []byte) (meta, error) {
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	mt := meta{
		magic:    order.Uint32(m[0:]),
		version:  order.Uint32(m[4:]),
		pageSize: order.Uint32(m[8:]),
		root:     order.Uint64(m[16:]),
		freelist: order.Uint64(m[32:]),
		hwm:      order.Uint64(m[40:]),
		txid:     order.Uint64(m[48:]),
		checksum: order.Uint64(m[56:]),
	}
	h := fnv.New64a()
	h.Write(m[:metaSummed])
	switch {
	case mt.magic != boltMagic:
		return mt, fmt.Errorf("no bbolt magic (found %#x)", mt.magic)
	case mt.version != boltVersion:
		return mt, fmt.Errorf("bbolt format version %d, want %d", mt.version, boltVersion)
	case mt.checksum != h.Sum64():
		return mt, errors.New("checksum mismatch")
	}
	return mt, nil
}

// layout is what the meta pages say about a file.
type layout struct {
	size     int64
	pageSize uint64
	meta     meta // the meta page bbolt uses
	metaPage int  // 0 or 1
}

// readLayout reads the meta pages of f and picks the one bbolt would use. It uses
// plain reads only: nothing is mapped. Its error is a *damage, or an I/O error.
func readLayout(f io.ReaderAt, size int64) (*layout, error) {
	if size == 0 {
		return nil, damagef("empty state file (0 bytes)")
	}
	ps, err := findPageSize(f, size)
	if err != nil {
		return nil, err
	}
	if ps < minPageSize || ps > maxPageSize || ps&(ps-1) != 0 {
		return nil, damagef("the meta page gives a page size of %d bytes, not a power of two between %d and %d", ps, minPageSize, maxPageSize)
	}
	if size < 2*int64(ps) {
		return nil, damagef("the file has %d bytes, less than its two %d-byte meta pages", size, ps)
	}
	var metas [2]meta
	var errs [2]error
	buf := make([]byte, pageHeaderSize+metaSize)
	for i := range metas {
		if err := readAt(f, buf, int64(i)*int64(ps)); err != nil {
			return nil, err
		}
		metas[i], errs[i] = parseMeta(buf)
	}
	// As bbolt's DB.meta: the meta with the higher txid if it is valid, else the
	// other one if that is valid.
	a, b := 0, 1
	if metas[1].txid > metas[0].txid {
		a, b = 1, 0
	}
	pick := a
	if errs[a] != nil {
		pick = b
	}
	if errs[pick] != nil {
		return nil, damagef("neither meta page is valid (page 0: %v; page 1: %v)", errs[0], errs[1])
	}
	l := &layout{size: size, pageSize: uint64(ps), meta: metas[pick], metaPage: pick}
	if got := l.meta.pageSize; uint64(got) != l.pageSize {
		return nil, damagef("meta page %d gives a page size of %d bytes, but the file's is %d", pick, got, ps)
	}
	return l, nil
}

// findPageSize finds the page size as bbolt's DB.getPageSize does: from meta page
// 0 when it is valid, else from the first valid meta page at 1KiB, 2KiB, ...
// 16MiB.
func findPageSize(f io.ReaderAt, size int64) (uint32, error) {
	buf := make([]byte, 0x1000)
	n, err := f.ReadAt(buf, 0)
	if n == len(buf) {
		if m, err := parseMeta(buf); err == nil {
			return m.pageSize, nil
		}
	} else if err != io.EOF {
		return 0, fmt.Errorf("read meta page 0: %v", err)
	}
	for i := range 15 {
		pos := int64(1024) << i
		if pos >= size-1024 {
			break
		}
		clear(buf)
		n, err := f.ReadAt(buf, pos)
		if err != nil && err != io.EOF {
			return 0, fmt.Errorf("read meta page 1: %v", err)
		}
		if n == len(buf) || int64(n) == size-pos {
			if m, err := parseMeta(buf); err == nil {
				return m.pageSize, nil
			}
		}
	}
	return 0, damagef("neither meta page is valid: no bbolt meta page with a valid checksum at the start of the file or at 1KiB to 16MiB")
}

// checkLayout checks that the chosen meta page's page ids fit the file, that the
// freelist is saved, and that the freelist page is a freelist page.
func checkLayout(l *layout) error {
	m, ps := l.meta, l.pageSize
	if pages := uint64(l.size) / ps; m.hwm > pages {
		return damagef("meta page %d (txid %d) says the file holds %d pages of %d bytes (%d bytes), but it has %d bytes: it is truncated",
			l.metaPage, m.txid, m.hwm, ps, satMul(m.hwm, ps), l.size)
	}
	if m.root < 2 || m.root >= m.hwm {
		return damagef("meta page %d (txid %d): the root bucket's page %d is outside the data pages [2, %d)", l.metaPage, m.txid, m.root, m.hwm)
	}
	if m.freelist == noFreelist {
		return damagef("meta page %d (txid %d): the freelist is not saved in the file, which this store always does", l.metaPage, m.txid)
	}
	if m.freelist < 2 || m.freelist >= m.hwm {
		return damagef("meta page %d (txid %d): the freelist page %d is outside the data pages [2, %d)", l.metaPage, m.txid, m.freelist, m.hwm)
	}
	return nil
}

func satMul(a, b uint64) uint64 {
	if b != 0 && a > ^uint64(0)/b {
		return ^uint64(0)
	}
	return a * b
}

// checkFile checks a bbolt file's structure with plain reads, before bbolt maps
// it: the meta pages (see readLayout and checkLayout), the freelist, and every
// page reachable from the root bucket, so that reading the file through bbolt
// cannot fault or trip one of bbolt's assertions. It returns the layout when the
// meta pages could be read, even when a later check fails. Its error is a *damage,
// or an I/O error.
func checkFile(f *os.File) (*layout, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	l, err := readLayout(f, fi.Size())
	if err != nil {
		return nil, err
	}
	if err := checkLayout(l); err != nil {
		return l, err
	}
	w := &walker{r: f, l: l, strict: true, seen: make(map[uint64]bool)}
	if w.free, err = w.readFreelist(); err != nil {
		return l, err
	}
	return l, w.walkTree("", l.meta.root, nil, w.checkAll(""))
}

// walker reads the B+trees of a file page by page with plain reads. A strict
// walker stops at the first problem; a lenient one (for salvage) notes it, skips
// what it cannot read and goes on.
type walker struct {
	r        io.ReaderAt
	l        *layout
	strict   bool
	free     map[uint64]bool // pages on the freelist (strict only)
	seen     map[uint64]bool // pages already read: none may be read twice
	depth    int
	problems []string // lenient only
}

// visitFunc is called for each element of a bucket's leaves, in page order.
type visitFunc func(k, v []byte, isBucket bool) error

// fail reports a problem: the error for a strict walker, nil for a lenient one.
func (w *walker) fail(err error) error {
	if w.strict {
		return err
	}
	w.problems = append(w.problems, err.Error())
	return nil
}

// readAt reads len(b) bytes at off; reading past the end of the file is damage.
func readAt(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	switch {
	case n == len(b):
		return nil
	case err == io.EOF || err == nil:
		return damagef("%d bytes at offset %d lie past the end of the file", len(b), off)
	default:
		return err
	}
}

// readPage reads page id with its overflow pages.
func (w *walker) readPage(id uint64, what string) ([]byte, error) {
	hwm, ps := w.l.meta.hwm, w.l.pageSize
	if id < 2 || id >= hwm {
		return nil, damagef("%s: page %d is outside the data pages [2, %d)", what, id, hwm)
	}
	buf := make([]byte, ps)
	if err := readAt(w.r, buf, int64(id*ps)); err != nil {
		return nil, fmt.Errorf("%s: page %d: %w", what, id, err)
	}
	if got := order.Uint64(buf); got != id {
		return nil, damagef("%s: page %d identifies as page %d", what, id, got)
	}
	overflow := uint64(order.Uint32(buf[12:]))
	if id+overflow >= hwm {
		return nil, damagef("%s: page %d and its %d overflow pages run past the high-water mark %d", what, id, overflow, hwm)
	}
	if id+overflow >= uint64(w.l.size)/ps {
		// Only a lenient walk gets here (checkLayout keeps the high-water mark
		// inside the file); do not allocate for pages that are not there.
		return nil, damagef("%s: page %d and its %d overflow pages run past the end of the file", what, id, overflow)
	}
	for p := id; p <= id+overflow; p++ {
		if w.seen[p] {
			return nil, damagef("%s: page %d is referenced twice", what, p)
		}
		if w.free[p] {
			return nil, damagef("%s: page %d is in use but also on the freelist", what, p)
		}
	}
	for p := id; p <= id+overflow; p++ {
		w.seen[p] = true
	}
	if overflow > 0 {
		buf = append(buf, make([]byte, overflow*ps)...)
		if err := readAt(w.r, buf[ps:], int64((id+1)*ps)); err != nil {
			return nil, fmt.Errorf("%s: page %d: %w", what, id, err)
		}
	}
	return buf, nil
}

// readFreelist reads and checks the freelist page: bbolt reads it when it opens a
// file for writing, and panics or faults on a wrong type or count, and allocates
// or frees its pages in later transactions.
func (w *walker) readFreelist() (map[uint64]bool, error) {
	id := w.l.meta.freelist
	buf, err := w.readPage(id, "freelist")
	if err != nil {
		return nil, err
	}
	if flags := order.Uint16(buf[8:]); flags != freelistPage {
		return nil, damagef("freelist: page %d has type %#x, want a freelist page (%#x)", id, flags, freelistPage)
	}
	first, n := uint64(0), uint64(order.Uint16(buf[10:]))
	if n == freelistLong {
		first, n = 1, order.Uint64(buf[pageHeaderSize:])
	}
	if room := uint64(len(buf)-pageHeaderSize) / 8; n > room-first {
		return nil, damagef("freelist: page %d lists %d free pages, more than its %d bytes hold", id, n, len(buf))
	}
	free := make(map[uint64]bool, n)
	hwm := w.l.meta.hwm
	for i := range n {
		p := order.Uint64(buf[pageHeaderSize+(first+i)*8:])
		switch {
		case p < 2 || p >= hwm:
			return nil, damagef("freelist: page %d lists page %d, outside the data pages [2, %d)", id, p, hwm)
		case free[p]:
			return nil, damagef("freelist: page %d lists page %d twice", id, p)
		case w.seen[p]:
			return nil, damagef("freelist: page %d lists itself (page %d) as free", id, p)
		}
		free[p] = true
	}
	return free, nil
}

// walkTree walks the tree of bucket whose root is page id. first is the key of
// the branch element that points at the page, nil for a bucket's root page.
func (w *walker) walkTree(bucket string, id uint64, first []byte, visit visitFunc) error {
	if w.depth >= maxDepth {
		return w.fail(damagef("%s: page %d is nested more than %d levels deep", bucketName(bucket), id, maxDepth))
	}
	buf, err := w.readPage(id, bucketName(bucket))
	if err != nil {
		return w.fail(err)
	}
	w.depth++
	defer func() { w.depth-- }()
	return w.walkPage(bucket, id, buf, first, visit)
}

// walkBucket walks the bucket stored in value v (a leaf element with the bucket
// flag): a tree of pages, or an inline page inside v.
func (w *walker) walkBucket(bucket string, v []byte, visit visitFunc) error {
	if len(v) < bucketHeaderSize {
		return w.fail(damagef("%s: the bucket's value has %d bytes, less than a bucket header", bucketName(bucket), len(v)))
	}
	if root := order.Uint64(v); root != 0 {
		return w.walkTree(bucket, root, nil, visit)
	}
	inline := v[bucketHeaderSize:]
	if len(inline) < pageHeaderSize {
		return w.fail(damagef("%s: the inline bucket's value has %d bytes, less than a page header", bucketName(bucket), len(v)))
	}
	if flags := order.Uint16(inline[8:]); flags != leafPage {
		return w.fail(damagef("%s: the inline bucket's page has type %#x, want a leaf page", bucketName(bucket), flags))
	}
	if w.depth >= maxDepth {
		return w.fail(damagef("%s: buckets are nested more than %d levels deep", bucketName(bucket), maxDepth))
	}
	w.depth++
	defer func() { w.depth-- }()
	return w.walkPage(bucket, 0, inline, nil, visit)
}

// walkPage walks a branch or leaf page held in buf: page id with its overflow, or
// (id 0) an inline bucket's page, which ends where its value ends. A page below a
// branch page starts with the key of the branch element (first): bbolt finds the
// element again by that key when it writes the page, and double-frees pages when
// it does not.
func (w *walker) walkPage(bucket string, id uint64, buf []byte, first []byte, visit visitFunc) error {
	where := fmt.Sprintf("%s: page %d", bucketName(bucket), id)
	if id == 0 {
		where = bucketName(bucket) + ": inline page"
	}
	flags, count := order.Uint16(buf[8:]), int(order.Uint16(buf[10:]))
	if pageHeaderSize+count*elemSize > len(buf) {
		return w.fail(damagef("%s: %d elements do not fit in its %d bytes", where, count, len(buf)))
	}
	if first != nil && count == 0 {
		return w.fail(damagef("%s is empty but a branch page points at it", where))
	}
	var prev []byte
	// kv returns the bytes of element i at pos from the element, n long, and checks
	// the key of length ksize.
	kv := func(i int, pos, n, ksize uint64) ([]byte, error) {
		start := uint64(pageHeaderSize+i*elemSize) + pos
		if start > uint64(len(buf)) || n > uint64(len(buf))-start {
			return nil, damagef("%s: element %d runs past the end of the page", where, i)
		}
		b := buf[start : start+n]
		key := b[:ksize]
		if ksize == 0 {
			return nil, damagef("%s: element %d has an empty key", where, i)
		}
		if i == 0 && first != nil && !bytes.Equal(key, first) {
			return nil, damagef("%s: the first key %q differs from the key %q its parent branch page has for it", where, key, first)
		}
		if prev != nil && bytes.Compare(prev, key) >= 0 {
			return nil, damagef("%s: element %d's key %q is not after the previous key %q", where, i, key, prev)
		}
		prev = key
		return b, nil
	}
	switch flags {
	case branchPage:
		if id == 0 {
			return w.fail(damagef("%s is a branch page", where))
		}
		if count == 0 {
			return w.fail(damagef("%s is an empty branch page", where))
		}
		for i := range count {
			e := buf[pageHeaderSize+i*elemSize:]
			pos, ksize, child := order.Uint32(e), order.Uint32(e[4:]), order.Uint64(e[8:])
			key, err := kv(i, uint64(pos), uint64(ksize), uint64(ksize))
			if err != nil {
				if err := w.fail(err); err != nil {
					return err
				}
				continue
			}
			if err := w.walkTree(bucket, child, key, visit); err != nil {
				return err
			}
		}
	case leafPage:
		for i := range count {
			e := buf[pageHeaderSize+i*elemSize:]
			eflags, pos, ksize, vsize := order.Uint32(e), order.Uint32(e[4:]), order.Uint32(e[8:]), order.Uint32(e[12:])
			b, err := kv(i, uint64(pos), uint64(ksize)+uint64(vsize), uint64(ksize))
			if err == nil && eflags&^bucketLeaf != 0 {
				err = damagef("%s: element %d has unknown flags %#x", where, i, eflags)
			}
			if err != nil {
				if err := w.fail(err); err != nil {
					return err
				}
				continue
			}
			if err := visit(b[:ksize], b[ksize:], eflags&bucketLeaf != 0); err != nil {
				return err
			}
		}
	default:
		return w.fail(damagef("%s has type %#x, want a branch (%#x) or leaf (%#x) page", where, flags, branchPage, leafPage))
	}
	return nil
}

// checkAll returns a visitor that walks every bucket nested in bucket.
func (w *walker) checkAll(bucket string) visitFunc {
	return func(k, v []byte, isBucket bool) error {
		if !isBucket {
			return nil
		}
		name := joinBucket(bucket, k)
		return w.walkBucket(name, v, w.checkAll(name))
	}
}

func joinBucket(parent string, k []byte) string {
	if parent == "" {
		return fmt.Sprintf("%q", k)
	}
	return fmt.Sprintf("%s/%q", parent, k)
}

func bucketName(bucket string) string {
	if bucket == "" {
		return "root bucket"
	}
	return "bucket " + bucket
}

// summary joins a lenient walk's problems into one message.
func summary(problems []string) string {
	const show = 3
	if len(problems) <= show {
		return strings.Join(problems, "; ")
	}
	return fmt.Sprintf("%s; and %d more problems", strings.Join(problems[:show], "; "), len(problems)-show)
}
