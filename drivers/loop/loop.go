package loop

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
)

// ParamFSType is the attribute that chooses the filesystem (FSExt4, FSXFS).
// The backend's other attributes are api.ParamMode, api.ParamUID and
// api.ParamGID (Backend.Attributes).
const ParamFSType = "fsType"

// Filesystem types.
const (
	FSExt4 = "ext4"
	FSXFS  = "xfs"
)

// Size limits, checked with mkfs on e2fsprogs 1.47.0 and xfsprogs 6.1.0.
const (
	// MinSizeExt4 is the smallest ext4 volume accepted. mke2fs formats 128KiB,
	// but below about 2MiB it leaves out the journal and such a volume holds
	// almost nothing; 1MiB keeps the limit round and safe.
	MinSizeExt4 int64 = 1 << 20
	// MinSizeXFS is xfsprogs' minimum ("Filesystem must be larger than 300MB",
	// which is 300MiB: 314572800 bytes pass, 4KiB less fail).
	MinSizeXFS int64 = 300 << 20
	// sizeAlign is the granularity sizes are rounded up to.
	sizeAlign int64 = 4096
)

// imgExt is the extension of backing files in Options.Dir.
const imgExt = ".img"

// Options configure the backend.
// Failpoints of Create, in order, for crash tests (see package
// framework/failpoint): after the backing file exists, after the loop device is
// attached (before mkfs), and after mkfs (before the framework mounts).
const (
	FailpointAfterFile   = "loop-after-file"
	FailpointAfterAttach = "loop-after-attach"
	FailpointAfterMkfs   = "loop-after-mkfs"
)

// Failpoints lists the failpoints of Create in order.
var Failpoints = []string{FailpointAfterFile, FailpointAfterAttach, FailpointAfterMkfs}

type Options struct {
	// Dir holds the backing files, one sparse <volumeID>.img per volume,
	// normally <state-dir>/loop. Required, absolute. It is created on first use.
	// The node disk behind it is consumed as pods write.
	Dir string
	// DefaultFSType is used when neither the "fsType" attribute nor the pod's
	// csi.fsType is set: "ext4" (default) or "xfs".
	DefaultFSType string
	// DefaultSize applies to volumes without a "size" attribute. Defaults to 0:
	// "size" is required.
	DefaultSize int64
	// MaxSize caps the size of a volume (after defaults and rounding) in bytes.
	// 0: no cap beyond the framework's MaxVolumeSize.
	MaxSize int64
	// DefaultMode is the mode of the filesystem's root directory when the "mode"
	// attribute is unset. Defaults to 0777, so any container user can write.
	DefaultMode fs.FileMode
	// MkfsExt4, MkfsXFS and Debugfs are the programs used to format volumes.
	// Empty: "mkfs.ext4", "mkfs.xfs" and "debugfs" are looked up in PATH when a
	// volume is formatted. debugfs (e2fsprogs) sets the root mode of ext4.
	MkfsExt4, MkfsXFS, Debugfs string
	// Preallocate allocates the whole backing file at Create (fallocate), so a
	// full node disk fails the publish with ResourceExhausted instead of turning
	// a later pod write into an I/O error. Defaults to false: files are sparse
	// and node disk is consumed as pods write (volumes may overcommit the disk).
	Preallocate bool
	// BufferedIO attaches loop devices without LO_FLAGS_DIRECT_IO. By default
	// the loop device does direct I/O on the backing file, so volume data is
	// cached once (in the volume's filesystem) instead of twice.
	BufferedIO bool
}

// Backend implements framework.Backend, framework.AttributeDeclarer,
// framework.Validator, framework.Lister and framework.HealthChecker.
type Backend struct {
	opts  Options
	attrs api.Attributes
}

// New returns a loop backend.
func New(opts Options) (*Backend, error) {
	if opts.Dir == "" || !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("loop backend: Dir %q must be an absolute path", opts.Dir)
	}
	opts.Dir = filepath.Clean(opts.Dir)
	if opts.DefaultFSType == "" {
		opts.DefaultFSType = FSExt4
	}
	if opts.DefaultFSType != FSExt4 && opts.DefaultFSType != FSXFS {
		return nil, fmt.Errorf("loop backend: DefaultFSType %q must be %q or %q", opts.DefaultFSType, FSExt4, FSXFS)
	}
	if opts.DefaultSize < 0 || opts.MaxSize < 0 {
		return nil, fmt.Errorf("loop backend: DefaultSize and MaxSize must not be negative")
	}
	if opts.DefaultMode == 0 {
		opts.DefaultMode = 0o777
	}
	return &Backend{opts: opts, attrs: api.Attributes{
		api.EnumAttr(ParamFSType, FSExt4, FSXFS),
		api.ModeAttr(opts.DefaultMode),
		api.UIDAttr().Default("0"),
		api.GIDAttr(), // unset: the pod's fsGroup, else 0 (Backend.root)
	}}, nil
}

// Attributes declares the loop attributes: "fsType" (the pod's fsType, else
// Options.DefaultFSType), "mode" (Options.DefaultMode), "uid" (default 0) and
// "gid" (the pod's fsGroup, else 0).
func (b *Backend) Attributes() api.Attributes { return b.attrs }

// Validate checks the attributes, applies the default size and rounds it up to
// 4KiB, and sets v.FSType to the filesystem the volume gets.
func (b *Backend) Validate(v *api.Volume) error {
	fsType, err := b.fsType(v)
	if err != nil {
		return err
	}
	size, err := b.size(v, fsType)
	if err != nil {
		return err
	}
	if _, err := b.root(v, fsType); err != nil {
		return err
	}
	v.FSType, v.Size = fsType, size
	return nil
}

// fsType resolves the filesystem from the "fsType" attribute, the pod's fsType
// and the default; v's attributes are applied.
func (b *Backend) fsType(v *api.Volume) (string, error) {
	attr := v.Values.String(ParamFSType)
	switch v.FSType {
	case "", FSExt4, FSXFS:
	default:
		return "", api.InvalidParamf("fsType %q is not supported by the loop backend; use %q or %q", v.FSType, FSExt4, FSXFS)
	}
	if attr != "" && v.FSType != "" && attr != v.FSType {
		return "", api.InvalidParamf("attribute %q is %q but the volume's fsType is %q; set one of them, or both to the same value", ParamFSType, attr, v.FSType)
	}
	switch {
	case attr != "":
		return attr, nil
	case v.FSType != "":
		return v.FSType, nil
	}
	return b.opts.DefaultFSType, nil
}

// size returns the volume size: the requested or default size rounded up to
// 4KiB, checked against the filesystem's minimum and MaxSize.
func (b *Backend) size(v *api.Volume, fsType string) (int64, error) {
	size := v.Size
	if size == 0 {
		if b.opts.DefaultSize == 0 {
			return 0, api.InvalidParamf("attribute %q is required for loop volumes (for example size: 1Gi)", api.ParamSize)
		}
		size = b.opts.DefaultSize
	}
	// The framework never passes a negative size; refuse one rather than let
	// roundUp turn it into 0. Above maxRoundable, roundUp would overflow;
	// maxRoundable itself is aligned, so a rounded size validates again.
	if size < 0 {
		return 0, api.InvalidParamf("attribute %q: %d bytes is negative", api.ParamSize, size)
	}
	if size > maxRoundable {
		return 0, api.InvalidParamf("attribute %q: %d bytes is too large", api.ParamSize, size)
	}
	size = roundUp(size)
	min := MinSizeExt4
	if fsType == FSXFS {
		min = MinSizeXFS
	}
	if size < min {
		return 0, api.InvalidParamf("attribute %q: %s is below the minimum of %s for %s volumes (mkfs.%s refuses smaller filesystems); ask for at least %s or use ext4",
			api.ParamSize, human(size), human(min), fsType, fsType, human(min))
	}
	if b.opts.MaxSize > 0 && size > b.opts.MaxSize {
		return 0, api.InvalidParamf("attribute %q: %s exceeds the loop backend's maximum of %s", api.ParamSize, human(size), human(b.opts.MaxSize))
	}
	return size, nil
}

// maxRoundable is the largest size roundUp takes: the largest multiple of
// sizeAlign (n+sizeAlign-1 does not overflow for n <= MaxInt64-sizeAlign+1).
const maxRoundable = math.MaxInt64 - sizeAlign + 1

// roundUp rounds n up to sizeAlign; n must be in [0, maxRoundable].
func roundUp(n int64) int64 { return (n + sizeAlign - 1) / sizeAlign * sizeAlign }

// human renders a byte count as an exact binary quantity when possible.
func human(n int64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// rootAttrs are the owner and mode of a new filesystem's root directory.
type rootAttrs struct {
	mode     fs.FileMode
	uid, gid int64
}

// root resolves "mode", "uid", "gid" (v's attributes, applied) and the pod's
// fsGroup. As in the tmpfs backend, an fsGroup becomes the group of the root
// when "gid" is unset, with mode 2775 when "mode" is unset.
func (b *Backend) root(v *api.Volume, fsType string) (rootAttrs, error) {
	mode, uid, gid := v.Values.Mode(api.ParamMode), v.Values.Int(api.ParamUID), v.Values.Int(api.ParamGID)
	if !v.Values.Has(api.ParamGID) && v.FSGroup != nil {
		gid = *v.FSGroup
		if !v.Values[api.ParamMode].Set {
			mode = fs.ModeSetgid | 0o775
		}
	}
	if fsType == FSXFS && mode&fs.ModeSticky != 0 {
		return rootAttrs{}, api.InvalidParamf("attribute %q: xfs volumes cannot have the sticky bit on their root (mkfs.xfs cannot set it); drop the leading 1 or use fsType ext4", api.ParamMode)
	}
	return rootAttrs{mode: mode, uid: uid, gid: gid}, nil
}

// unixMode returns m as a Unix directory mode (S_IFDIR and the special bits).
func unixMode(m fs.FileMode) uint32 { return api.ModeBits(m) | 0o040000 }

// mkfsArgs returns the arguments of mkfs.<fsType> for dev; proto is the path of
// an xfs protofile ("" for none).
//
// ext4 keeps its journal: a volume survives a node crash or reboot until it is
// republished (the backing file stays), and the journal makes the remount
// consistent without an fsck. Lazy inode-table and journal init make mkfs
// O(1); nodiscard skips discarding a file that is sparse anyway; -m 0 gives
// the pod the whole size (no root reserve); root_owner sets the root's owner
// explicitly instead of mke2fs' default (the caller's IDs).
func mkfsArgs(fsType, dev, proto string, r rootAttrs) []string {
	if fsType == FSXFS {
		args := []string{"-q", "-f", "-K"}
		if proto != "" {
			args = append(args, "-p", proto)
		}
		return append(args, dev)
	}
	return []string{"-q", "-F", "-m", "0",
		"-E", fmt.Sprintf("lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=%d:%d", r.uid, r.gid),
		dev}
}

// ext4ModeDefault is the root mode mke2fs creates; any other needs debugfs.
const ext4ModeDefault fs.FileMode = 0o755

// debugfsArgs returns the arguments of debugfs that set the root directory's
// mode on the unmounted ext4 on dev, or nil when mkfs already did.
func debugfsArgs(dev string, r rootAttrs) []string {
	if r.mode == ext4ModeDefault {
		return nil
	}
	return []string{"-w", "-R", fmt.Sprintf("set_inode_field / mode 0%o", unixMode(r.mode)), dev}
}

// xfsProto returns an mkfs.xfs protofile that only describes the root
// directory: its mode (setuid, setgid and permission bits; xfs' protofile
// format has no sticky bit) and owner.
func xfsProto(r rootAttrs) string {
	u, g := "-", "-"
	if r.mode&fs.ModeSetuid != 0 {
		u = "u"
	}
	if r.mode&fs.ModeSetgid != 0 {
		g = "g"
	}
	return fmt.Sprintf("ephemera\n0 0\nd%s%s%03o %d %d\n$\n", u, g, uint32(r.mode.Perm()), r.uid, r.gid)
}

// Superblock detection.
const (
	// superblockProbe is how many bytes of a device detectFS needs.
	superblockProbe = 4096
	ext4MagicOffset = 1080 // 1024 (superblock) + 0x38 (s_magic)
	ext4Magic       = 0xEF53
	// xfsInProgressOffset is sb_inprogress: mkfs.xfs sets it while it writes
	// the filesystem and clears it last.
	xfsInProgressOffset = 126
)

// detectFS reports which filesystem the first bytes of a device hold: "xfs",
// "ext4" (any ext2/3/4 superblock), or "" for none or an unfinished mkfs.xfs.
func detectFS(b []byte) string {
	if len(b) >= 4 && bytes.Equal(b[:4], []byte("XFSB")) {
		if len(b) > xfsInProgressOffset && b[xfsInProgressOffset] != 0 {
			return ""
		}
		return FSXFS
	}
	if len(b) >= ext4MagicOffset+2 && binary.LittleEndian.Uint16(b[ext4MagicOffset:]) == ext4Magic {
		return FSExt4
	}
	return ""
}

// deletedSuffix is what the kernel appends to the path of an unlinked file.
const deletedSuffix = " (deleted)"

// parseBackingFile parses the contents of /sys/block/loopN/loop/backing_file.
func parseBackingFile(s string) (path string, deleted bool) {
	s = strings.TrimSuffix(s, "\n")
	if p, ok := strings.CutSuffix(s, deletedSuffix); ok {
		return p, true
	}
	return s, false
}

// isLoopName reports whether name is a loop device's name in /sys/block ("loop7").
func isLoopName(name string) bool {
	n, ok := strings.CutPrefix(name, "loop")
	if !ok || n == "" {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// volumeIDOf returns the volume ID of a backing file path inside dir, or "".
func volumeIDOf(dir, path string) string {
	if filepath.Dir(path) != dir {
		return ""
	}
	return idOfName(filepath.Base(path))
}

// idOfName returns the volume ID of a backing file name ("<id>.img"), or "".
func idOfName(name string) string {
	id, ok := strings.CutSuffix(name, imgExt)
	if !ok || validID(id) != nil {
		return ""
	}
	return id
}

func validID(id string) error {
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\\\x00") || strings.HasPrefix(id, ".") {
		return fmt.Errorf("loop backend: invalid volume ID %q", id)
	}
	return nil
}

// sortedIDs returns the keys of set in order.
func sortedIDs(set map[string]bool) []string {
	if len(set) == 0 {
		return nil
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// loFileName returns the lo_file_name for a backing path: the path, or its
// last 63 bytes when longer (the ID-bearing end is the useful part).
func loFileName(path string) []byte {
	const max = 63 // LO_NAME_SIZE less the terminating NUL
	if len(path) > max {
		path = path[len(path)-max:]
	}
	return []byte(path)
}
