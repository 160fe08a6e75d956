package content

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/ephemera-csi/ephemera/api"
)

// DataDir is the name of the link that points at the current timestamped
// directory.
const DataDir = "..data"

const (
	// dataTmp is the scratch name a new link is created under before it is
	// renamed into place.
	dataTmp = "..data_tmp"
	// tsLayout formats the timestamp part of a timestamped directory's name.
	tsLayout = "2006_01_02_15_04_05"
	// dirMode is the mode of every directory Write creates.
	dirMode fs.FileMode = 0o755
)

// tsPattern matches the names of timestamped directories (also the kubelet's).
var tsPattern = regexp.MustCompile(`^\.\.[0-9]{4}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}_[0-9]{2}\.[0-9]+$`)

// Options tunes Write.
type Options struct {
	// FSGroup is the pod's fsGroup: when set, every file, directory and link
	// Write creates belongs to this group and files are group-readable. nil (the
	// zero Options) leaves the group alone. Must be nil on Windows.
	FSGroup *int64
	// Limits bound the file set (files, path length and depth, bytes): a set
	// beyond them is refused before anything is written. The zero value takes
	// the defaults.
	Limits Limits
	// Now returns the time used to name the timestamped directory; nil means
	// time.Now. It is a test hook.
	Now func() time.Time
	// Admit, when set, is called once the files are known to differ from
	// the current content, before anything is written: an error stops the
	// Write with it, the previous content in place. A Write that swaps
	// nothing never calls it. The framework reserves here, from its
	// content capacity, what the volume may hold where the driver pays for
	// its memory (no pod cgroups).
	Admit func() error
	// WriteFiles, when set, writes the new files in Write's place: the
	// framework's writer in the pod's memory cgroup
	// (framework/internal/podcgroup), so that their pages are charged to
	// the pod. It is called once per swap with the volume's directory,
	// open, and the new timestamped directory's files keyed by their name
	// below the directory ("<timestamped directory>/<file name>"), each
	// File.Mode the file's final permission bits; it makes the timestamped
	// directory and every parent of a file, with mode 0755 and group gid
	// (-1: leave it), creates every file exclusively, without following a
	// link, and syncs what it made. Write makes the directory itself when
	// there is no file to write. A failure whose cause is a full volume
	// should be errors.Is ErrNoSpace.
	WriteFiles func(ctx context.Context, dir *os.File, files map[string]api.File, gid int) error
}

// Write atomically replaces the content of dir with files, keyed by slash-
// separated relative path (see the package documentation for the layout). When
// files equal the current content, nothing is swapped. Bad names, and a set
// beyond opts.Limits, return an error wrapping api.ErrInvalidParams before
// anything is written; content that does not fit the volume returns one
// wrapping api.ErrResourceExhausted (ErrNoSpace). Write stops between two
// files or directories once ctx is done, leaving the previous content in
// place.
func Write(ctx context.Context, dir string, files map[string]api.File, opts Options) error {
	p, err := newPlan(ctx, files, gidOf(opts), opts.Limits)
	if err != nil {
		return err
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return p.write(r, opts)
}

// WriteRoot is Write on a directory the caller opened, for example one resolved
// beneath the kubelet root without following links (the framework's case):
// nothing Write does leaves r.
func WriteRoot(ctx context.Context, r *os.Root, files map[string]api.File, opts Options) error {
	p, err := newPlan(ctx, files, gidOf(opts), opts.Limits)
	if err != nil {
		return err
	}
	return p.write(r, opts)
}

// write is WriteRoot of a validated plan.
func (p *plan) write(r *os.Root, opts Options) error {
	now := opts.Now
	if now == nil {
		now = time.Now
	}

	old, cerr := current(r)
	if old == "" && len(p.names) == 0 {
		if _, err := r.Lstat(DataDir); errors.Is(err, fs.ErrNotExist) {
			return nil // never had content, and none to write
		}
	}
	ts, swapped := old, false
	if cerr != nil || old == "" || !p.matches(r, old) {
		if err := p.done(); err != nil {
			return err
		}
		if opts.Admit != nil {
			if err := opts.Admit(); err != nil {
				return err
			}
		}
		var err error
		if ts, err = p.writeDir(r, now(), opts.WriteFiles); err != nil {
			err = p.writeError(err)
			if ts != "" && undo(r, ts) {
				err = rolledBack(err)
			}
			return err
		}
		if err := p.swapData(r, ts); err != nil {
			err = fmt.Errorf("swapping in the new files: %w", err)
			if undo(r, ts) {
				err = rolledBack(err)
			}
			return err
		}
		swapped = true
	}
	if err := p.makeVisible(r); err != nil {
		err = fmt.Errorf("linking the files: %w", err)
		if swapped && p.removeStale(r, ts) == nil {
			err = replaced(err)
		}
		return err
	}
	if err := p.removeStale(r, ts); err != nil {
		return fmt.Errorf("removing old files: %w", err)
	}
	if err := syncDir(r, "."); err != nil {
		if swapped {
			err = replaced(err)
		}
		return err
	}
	return nil
}

// Current returns the name of the timestamped directory ..data points at, or ""
// when dir has no content yet. It fails when ..data is not a link to a
// timestamped directory inside dir.
func Current(dir string) (string, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return "", err
	}
	defer r.Close()
	return current(r)
}

// Read returns the files of the current content of dir, keyed by slash-separated
// path, with their effective permission bits. It returns an empty map when dir
// has no content yet.
func Read(dir string) (map[string]api.File, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	ts, err := current(r)
	if err != nil {
		return nil, err
	}
	out := map[string]api.File{}
	if ts == "" {
		return out, nil
	}
	sub, err := r.OpenRoot(ts)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	err = fs.WalkDir(sub.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s/%s is not a regular file", ts, name)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := sub.ReadFile(name)
		if err != nil {
			return err
		}
		out[name] = api.File{Data: data, Mode: fi.Mode().Perm()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// current returns the timestamped directory ..data points at, "" when there is
// no ..data.
func current(r *os.Root) (string, error) {
	t, err := readLink(r, DataDir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if !tsPattern.MatchString(t) {
		return "", fmt.Errorf("%s points at %q, not a timestamped directory", DataDir, t)
	}
	fi, err := r.Lstat(t)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s points at %q, which is not a directory", DataDir, t)
	}
	return t, nil
}

// plan is a validated file set.
type plan struct {
	ctx   context.Context // checked between two steps
	gid   int
	files map[string]api.File
	modes map[string]fs.FileMode
	names []string        // file names, sorted
	dirs  []string        // directories to create, sorted: parents first
	top   map[string]bool // top-level entries
}

// gidOf is the group Write gives what it creates, -1 for none.
func gidOf(opts Options) int {
	if opts.FSGroup == nil || *opts.FSGroup < 0 {
		return -1
	}
	return int(*opts.FSGroup)
}

// newPlan validates files against l (files, names, bytes: all before any
// other work) and derives the directories to create. Its cost is linear in
// the total length of the names: each name's parents are added from the
// deepest up, stopping at the first one already known.
func newPlan(ctx context.Context, files map[string]api.File, gid int, l Limits) (*plan, error) {
	if gid < 0 {
		gid = -1
	}
	l = l.WithDefaults()
	if err := l.checkSet(files); err != nil {
		return nil, err
	}
	p := &plan{ctx: ctx, gid: gid, files: files, modes: make(map[string]fs.FileMode, len(files)), top: map[string]bool{}}
	dirs := map[string]bool{}
	for name, f := range files {
		p.names = append(p.names, name)
		m := f.Mode.Perm()
		if m == 0 {
			m = 0o644
		}
		if gid >= 0 {
			m |= 0o040
		}
		p.modes[name] = m
		top, _, _ := strings.Cut(name, "/")
		p.top[top] = true
		for i := strings.LastIndexByte(name, '/'); i > 0; i = strings.LastIndexByte(name[:i], '/') {
			if dirs[name[:i]] {
				break // and so are all its parents
			}
			dirs[name[:i]] = true
		}
	}
	for d := range dirs {
		if _, ok := files[d]; ok {
			return nil, api.InvalidParamf("content file name %q is also the directory of another file", d)
		}
		p.dirs = append(p.dirs, d)
	}
	sort.Strings(p.names)
	sort.Strings(p.dirs)
	return p, nil
}

// checkName validates one file name: relative, clean, slash-separated, no
// component starting with ".." (reserved), and local on every platform.
func checkName(name string) error {
	bad := func(why string) error {
		return api.InvalidParamf("content file name %q %s", name, why)
	}
	switch {
	case name == "":
		return bad("is empty")
	case strings.ContainsAny(name, "\\\x00"):
		return bad("contains a backslash or NUL")
	case path.IsAbs(name) || filepath.IsAbs(name):
		return bad("must be a relative path")
	case name == ".":
		return bad("names the volume itself")
	case path.Clean(name) != name:
		return bad(`must be a clean path (no "." or empty components, no trailing slash)`)
	}
	for _, c := range strings.Split(name, "/") {
		if strings.HasPrefix(c, "..") {
			return bad(`has a component starting with ".." (reserved)`)
		}
	}
	if !filepath.IsLocal(filepath.FromSlash(name)) {
		return bad("is not a local path on this platform")
	}
	return nil
}

// matches reports whether the timestamped directory ts holds exactly the plan's
// files with the same data, effective modes and group. Any error means no.
func (p *plan) matches(r *os.Root, ts string) bool {
	sub, err := r.OpenRoot(ts)
	if err != nil {
		return false
	}
	defer sub.Close()
	dirs := make(map[string]bool, len(p.dirs))
	for _, d := range p.dirs {
		dirs[d] = true
	}
	nfiles, ndirs := 0, 0
	err = fs.WalkDir(sub.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := p.done(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if p.gid >= 0 && fileGID(fi) != p.gid {
			return errMismatch
		}
		switch {
		case d.IsDir():
			if name != "." && !dirs[name] {
				return errMismatch
			}
			if name != "." {
				ndirs++
			}
			return nil
		case d.Type().IsRegular():
			f, ok := p.files[name]
			if !ok || fi.Mode() != p.modes[name] || fi.Size() != int64(len(f.Data)) {
				return errMismatch
			}
			data, err := sub.ReadFile(name)
			if err != nil || !bytes.Equal(data, f.Data) {
				return errMismatch
			}
			nfiles++
			return nil
		default:
			return errMismatch
		}
	})
	return err == nil && nfiles == len(p.names) && ndirs == len(p.dirs)
}

var errMismatch = errors.New("content differs")

// ErrNoSpace is wrapped by the error of a Write whose content does not fit the
// volume (no space, no inodes, a quota). It wraps api.ErrResourceExhausted.
var ErrNoSpace = fmt.Errorf("%w: the content does not fit the volume", api.ErrResourceExhausted)

// done returns the plan's context's error, nil while it is not done.
func (p *plan) done() error { return p.ctx.Err() }

// writeError is the error of a failed writeDir: for content that does not fit,
// what a pod's author can act on (the set's size, not a descriptor's path).
func (p *plan) writeError(err error) error {
	if !noSpace(err) && !errors.Is(err, ErrNoSpace) {
		return fmt.Errorf("writing the files: %w", err)
	}
	var n int64
	for _, f := range p.files {
		n += int64(len(f.Data))
	}
	return fmt.Errorf("%w (%d files, %d bytes of data, %d directories)", ErrNoSpace, len(p.names), n, len(p.dirs))
}

// writeDir creates and fills a fresh timestamped directory and returns its name.
// Everything is created exclusively inside the new directory, with modes and
// groups set through open descriptors, and fsync'd. On failure it returns
// the name of the directory it made ("" when it made none), which the caller
// removes (undo). With a writer (Options.WriteFiles), the writer does it.
func (p *plan) writeDir(r *os.Root, t time.Time, writer func(context.Context, *os.File, map[string]api.File, int) error) (ts string, err error) {
	if writer != nil && len(p.names) > 0 {
		return p.writeDirWith(r, t, writer)
	}
	for i := 0; ; i++ {
		ts = tsName(t)
		err = r.Mkdir(ts, 0o700)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || i >= 10 {
			return "", err
		}
	}
	sub, err := r.OpenRoot(ts)
	if err != nil {
		return ts, err
	}
	defer sub.Close()
	if err := p.setDir(sub, "."); err != nil {
		return ts, err
	}
	for _, d := range p.dirs {
		if err := p.done(); err != nil {
			return ts, err
		}
		if err := sub.Mkdir(d, 0o700); err != nil {
			return ts, err
		}
		if err := p.setDir(sub, d); err != nil {
			return ts, err
		}
	}
	for _, name := range p.names {
		if err := p.done(); err != nil {
			return ts, err
		}
		if err := p.writeFile(sub, name); err != nil {
			return ts, err
		}
	}
	for i := len(p.dirs) - 1; i >= 0; i-- {
		if err := syncDir(sub, p.dirs[i]); err != nil {
			return ts, err
		}
	}
	if err := syncDir(sub, "."); err != nil {
		return ts, err
	}
	return ts, nil
}

// tsName returns a fresh timestamped directory name for time t.
func tsName(t time.Time) string {
	return fmt.Sprintf("..%s.%d", t.UTC().Format(tsLayout), rand.Uint32())
}

// writeDirWith is writeDir by writer, which makes the directory and the
// files. The name is one nothing in r has: the writer would write into a
// directory that exists (its files are created exclusively all the same).
func (p *plan) writeDirWith(r *os.Root, t time.Time, writer func(context.Context, *os.File, map[string]api.File, int) error) (string, error) {
	ts := tsName(t)
	for i := 0; ; i++ {
		_, err := r.Lstat(ts)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return "", err
		}
		if i >= 10 {
			return "", fmt.Errorf("%s: %w", ts, fs.ErrExist)
		}
		ts = tsName(t)
	}
	files := make(map[string]api.File, len(p.names))
	for _, name := range p.names {
		files[ts+"/"+name] = api.File{Data: p.files[name].Data, Mode: p.modes[name]}
	}
	dir, err := r.Open(".")
	if err != nil {
		return "", err
	}
	defer dir.Close()
	return ts, writer(p.ctx, dir, files, p.gid)
}

// ErrRolledBack is wrapped by the error of a Write that failed after
// Options.Admit let it write and removed everything it had written of the
// new files: of what Write made, the volume holds the previous content
// only, as before the call. The error of a Write that failed later, or
// could not remove what it wrote, does not wrap it: some of the new files
// may be left beside the previous content (until the next Write removes
// them), or have replaced it.
var ErrRolledBack = errors.New("the new files were removed, the previous content stays")

// ErrReplaced is wrapped by the error of a Write that swapped the new files
// in and removed every other timestamped directory, then failed (linking
// the top-level names, the last sync): of what Write made, the volume holds
// the new content only.
var ErrReplaced = errors.New("the new files replaced the previous ones")

// rolledBack marks err as the error of a Write that removed what it wrote.
func rolledBack(err error) error { return fmt.Errorf("%w; %w", err, ErrRolledBack) }

// replaced marks err as the error of a Write whose new files replaced the
// previous ones.
func replaced(err error) error { return fmt.Errorf("%w; %w", err, ErrReplaced) }

// undo removes the timestamped directory ts a failed Write made, and the
// scratch link it may have left, and reports whether nothing of either is
// left.
func undo(r *os.Root, ts string) bool {
	return r.RemoveAll(ts) == nil && r.RemoveAll(dataTmp) == nil
}

// setDir gives a directory Write created its mode and group.
func (p *plan) setDir(sub *os.Root, name string) error {
	f, err := sub.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	if p.gid >= 0 {
		if err := f.Chown(-1, p.gid); err != nil {
			return err
		}
	}
	return f.Chmod(dirMode)
}

func (p *plan) writeFile(sub *os.Root, name string) error {
	f, err := sub.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(p.files[name].Data)
	if err == nil && p.gid >= 0 {
		err = f.Chown(-1, p.gid)
	}
	if err == nil {
		err = f.Chmod(p.modes[name]) // through the descriptor: not subject to umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// swapData points ..data at ts atomically.
func (p *plan) swapData(r *os.Root, ts string) error {
	if err := p.newLink(r, ts); err != nil {
		return err
	}
	return replaceLink(r, dataTmp, DataDir)
}

// newLink creates dataTmp as a link to target, replacing whatever was left there.
func (p *plan) newLink(r *os.Root, target string) error {
	if err := r.RemoveAll(dataTmp); err != nil {
		return err
	}
	if err := makeLink(r, target, dataTmp); err != nil {
		return err
	}
	if p.gid >= 0 {
		return r.Lchown(dataTmp, -1, p.gid)
	}
	return nil
}

// makeVisible makes every top-level entry a link to ..data/<entry>, replacing
// whatever else is there, and removes links of entries no longer in the set.
func (p *plan) makeVisible(r *os.Root) error {
	tops := make([]string, 0, len(p.top))
	for t := range p.top {
		tops = append(tops, t)
	}
	sort.Strings(tops)
	for _, t := range tops {
		want := DataDir + "/" + t
		got, err := readLink(r, t)
		if err == nil && got == want {
			continue
		}
		if errors.Is(err, fs.ErrNotExist) {
			if err := makeLink(r, want, t); err == nil {
				if p.gid >= 0 {
					if err := r.Lchown(t, -1, p.gid); err != nil {
						return err
					}
				}
				continue
			}
		}
		if err := p.newLink(r, want); err != nil {
			return err
		}
		if err := replaceLink(r, dataTmp, t); err != nil {
			return err
		}
	}
	ents, err := readDir(r)
	if err != nil {
		return err
	}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, "..") || p.top[n] || e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		if got, err := readLink(r, n); err == nil && got == DataDir+"/"+n {
			if err := r.Remove(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// removeStale removes every timestamped directory except keep, and a leftover
// dataTmp.
func (p *plan) removeStale(r *os.Root, keep string) error {
	ents, err := readDir(r)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		n := e.Name()
		switch {
		case n == dataTmp:
			errs = append(errs, r.RemoveAll(n))
		case n != keep && tsPattern.MatchString(n) && e.IsDir() && e.Type()&fs.ModeSymlink == 0:
			errs = append(errs, r.RemoveAll(n))
		}
	}
	return errors.Join(errs...)
}

func readDir(r *os.Root) ([]fs.DirEntry, error) {
	f, err := r.Open(".")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
}
