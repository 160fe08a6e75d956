package content

import (
	"strings"

	"github.com/ephemera-csi/ephemera/api"
)

// Defaults of Limits. They bound what one file set can make Write do (and,
// through the plugin package, what a plugin's answer can make the driver
// hold in memory) well beyond what a Secret, ConfigMap or projected volume
// needs: the kubelet's own objects are at most 1MiB each.
const (
	// DefaultMaxFiles is the most files one set may have.
	DefaultMaxFiles = 10000
	// DefaultMaxDepth is the most components one file's path may have
	// ("a/b/c" has 3).
	DefaultMaxDepth = 32
	// DefaultMaxPathBytes is the longest one file's path may be, in bytes.
	DefaultMaxPathBytes = 1024
	// MaxNameBytes is the longest one component may be: NAME_MAX on Linux,
	// and the limit of NTFS (in UTF-16 units, fewer than bytes).
	MaxNameBytes = 255
	// FileOverhead is what each file costs beside its path and data in a
	// set's Cost: the memory of one decoded file (its message, its map entry,
	// its headers) rounded up, and on disk at least one inode and a directory
	// entry. It makes a million empty files as costly as the 512MB they take
	// to hold.
	FileOverhead = 512
)

// Limits bound one file set. Zero fields take the defaults above; MaxBytes
// zero means no bound on bytes (the volume's size bounds what can be written;
// in memory the set is already the caller's).
type Limits struct {
	// MaxFiles bounds the number of files. Default DefaultMaxFiles.
	MaxFiles int
	// MaxDepth bounds the components of a path. Default DefaultMaxDepth.
	MaxDepth int
	// MaxPathBytes bounds the length of a path. Default DefaultMaxPathBytes.
	MaxPathBytes int
	// MaxBytes bounds the set's Cost. Default: none.
	MaxBytes int64
}

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultMaxFiles
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.MaxPathBytes <= 0 {
		l.MaxPathBytes = DefaultMaxPathBytes
	}
	return l
}

// Cost is what one file of a set counts against Limits.MaxBytes: its data,
// its path and FileOverhead.
func Cost(name string, size int) int64 {
	return int64(size) + int64(len(name)) + FileOverhead
}

// CheckFiles reports whether a set of n files fits l. The caller applies
// WithDefaults first.
func (l Limits) CheckFiles(n int) error {
	if n > l.MaxFiles {
		return api.InvalidParamf("the content has more than %d files (%d)", l.MaxFiles, n)
	}
	return nil
}

// CheckBytes reports whether a set of the given Cost fits l.
func (l Limits) CheckBytes(cost int64) error {
	if l.MaxBytes > 0 && cost > l.MaxBytes {
		return api.InvalidParamf("the content takes more than %d bytes (data, paths and %d bytes per file)", l.MaxBytes, FileOverhead)
	}
	return nil
}

// CheckPath checks one file name against l's bounds on length, depth and
// component length (CheckName checks the rules of names). Its cost is bounded
// by l.MaxPathBytes whatever the name. The caller applies WithDefaults first.
func (l Limits) CheckPath(name string) error {
	if len(name) > l.MaxPathBytes {
		return api.InvalidParamf("content file name %q is %d bytes long, beyond the bound of %d", clip(name), len(name), l.MaxPathBytes)
	}
	if depth := strings.Count(name, "/") + 1; depth > l.MaxDepth {
		return api.InvalidParamf("content file name %q is %d levels deep, beyond the bound of %d", clip(name), depth, l.MaxDepth)
	}
	for c := range strings.SplitSeq(name, "/") {
		if len(c) > MaxNameBytes {
			return api.InvalidParamf("content file name %q has a component of %d bytes, beyond the bound of %d", clip(name), len(c), MaxNameBytes)
		}
	}
	return nil
}

// CheckName validates one file name by the rules of the package
// documentation: relative, clean, slash-separated, no component starting
// with ".." (reserved), and local on every platform.
func CheckName(name string) error { return checkName(name) }

// clip shortens a name for a message.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkSet checks a whole set against l before anything is done with it:
// the number of files first, then each name, then the cost.
func (l Limits) checkSet(files map[string]api.File) error {
	if err := l.CheckFiles(len(files)); err != nil {
		return err
	}
	var cost int64
	for name, f := range files {
		if err := l.CheckPath(name); err != nil {
			return err
		}
		if err := checkName(name); err != nil {
			return err
		}
		cost += Cost(name, len(f.Data))
	}
	return l.CheckBytes(cost)
}
