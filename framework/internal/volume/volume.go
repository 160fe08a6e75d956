package volume

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/winpath"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// The kubelet's layout below its root directory (pkg/volume/csi): an inline
// volume's target is <root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount,
// and vol_data.json is written beside the target, in <name>.
const (
	PodsDir     = "pods"
	VolumesDir  = "volumes"
	PluginDir   = "kubernetes.io~csi" // EscapeQualifiedName("kubernetes.io/csi")
	MountDir    = "mount"
	VolDataFile = "vol_data.json"
)

// TargetPath returns the target of volume name of pod uid below root.
func TargetPath(root, podUID, name string) string {
	return filepath.Join(root, PodsDir, podUID, VolumesDir, PluginDir, name, MountDir)
}

// VolumeDir returns the directory that holds a target and its vol_data.json.
func VolumeDir(root, podUID, name string) string {
	return filepath.Join(root, PodsDir, podUID, VolumesDir, PluginDir, name)
}

// FrameworkParams are the attributes the framework consumes itself; a backend
// never sees them in Volume.Params.
var FrameworkParams = []string{api.ParamSize, api.ParamBackend}

// BackendParams returns params without the framework's attributes.
func BackendParams(params api.Params) api.Params {
	p := params.Clone()
	if p == nil {
		p = api.Params{}
	}
	for _, k := range FrameworkParams {
		delete(p, k)
	}
	return p
}

// CheckWithoutValidator is what the framework accepts of a backend that is not
// a Validator: no attribute of its own and no fsType.
func CheckWithoutValidator(v *api.Volume) error {
	if err := v.Params.Only(); err != nil {
		return fmt.Errorf("backend %q: %w", v.Backend, err)
	}
	if v.FSType != "" {
		return api.InvalidParamf("fsType %q is not supported by backend %q; leave fsType unset", v.FSType, v.Backend)
	}
	return nil
}

// FromRecord is the backend's view of a persisted volume: what Create received,
// without Secrets and Tokens, which are never persisted.
func FromRecord(rec *store.Record) *api.Volume {
	return &api.Volume{
		ID:         rec.VolumeID,
		Name:       rec.VolumeName,
		TargetPath: rec.TargetPath,
		Pod:        rec.Pod,
		Backend:    rec.Backend,
		ReadOnly:   rec.ReadOnly,
		FSType:     rec.FSType,
		FSGroup:    rec.FSGroup,
		Size:       rec.Size,
		Params:     BackendParams(rec.Params),
		State:      rec.State,
	}
}

// Orphan is the view of storage found in a backend's inventory without a
// record: only the ID and the backend are known.
func Orphan(id, backend string) *api.Volume {
	return &api.Volume{ID: id, Backend: backend}
}

// Target is a parsed, validated target path.
type Target struct {
	PodUID     string
	VolumeName string
}

// Handle is the volume handle the kubelet derives for t.
func (t Target) Handle() string { return api.VolumeHandle(t.PodUID, t.VolumeName) }

// CheckHandle verifies that id is the handle the kubelet derives for t.
func (t Target) CheckHandle(id string) error {
	if want := t.Handle(); id != want {
		return fmt.Errorf("volume_id %q does not match target path of pod %s volume %q (expected %s); inline volume handles are derived by the kubelet", id, t.PodUID, t.VolumeName, want)
	}
	return nil
}

// normalize turns p into a slash-separated path for parsing (Windows: one
// spelling, see winpath).
func normalize(p string, windows bool) string {
	if windows {
		return winpath.Slash(p)
	}
	return p
}

// SameTarget reports whether two target paths name the same target: equal
// after cleaning (on Windows after winpath's spelling, without regard to case).
func SameTarget(a, b string, windows bool) bool {
	if windows {
		return path.Clean(winpath.Slash(winpath.Key(a))) == path.Clean(winpath.Slash(winpath.Key(b)))
	}
	return path.Clean(a) == path.Clean(b)
}

// ParseTarget checks that t is <root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount
// and returns the pod UID and volume name. It is lexical: no file system
// access. windows selects Windows path rules.
func ParseTarget(root, t string, windows bool) (Target, error) {
	if t == "" {
		return Target{}, fmt.Errorf("target_path is required")
	}
	nt := normalize(t, windows)
	nr := path.Clean(normalize(root, windows))
	for _, e := range strings.Split(nt, "/") {
		if e == ".." {
			return Target{}, fmt.Errorf("target_path %q must not contain '..'", t)
		}
	}
	if !isAbs(nt, windows) {
		return Target{}, fmt.Errorf("target_path %q must be absolute", t)
	}
	nt = path.Clean(nt)
	prefix := nr + "/" + PodsDir + "/"
	if nr == "/" {
		prefix = "/" + PodsDir + "/"
	}
	rest, ok := cutPrefix(nt, prefix, windows)
	if !ok {
		return Target{}, fmt.Errorf("target_path %q is not under the kubelet's pods directory %s; is the driver's --kubelet-root set to the kubelet's --root-dir?", t, prefix)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != VolumesDir || parts[2] != PluginDir || parts[4] != MountDir {
		return Target{}, fmt.Errorf("target_path %q does not have the form %s<pod-uid>/%s/%s/<volume-name>/%s used for inline volumes", t, prefix, VolumesDir, PluginDir, MountDir)
	}
	if !ValidUID(parts[0]) {
		return Target{}, fmt.Errorf("target_path %q: %q is not a pod UID the kubelet produces (a lowercase UUID, or 32 lowercase hex digits for a static pod)", t, parts[0])
	}
	if !validVolumeName(parts[3]) {
		return Target{}, fmt.Errorf("target_path %q: %q is not a valid pod volume name (DNS label)", t, parts[3])
	}
	return Target{PodUID: parts[0], VolumeName: parts[3]}, nil
}

func isAbs(p string, windows bool) bool {
	if windows { // a drive path, or a share or device path (never under a kubelet root)
		return len(p) >= 3 && p[0] >= 'a' && p[0] <= 'z' && p[1] == ':' && p[2] == '/' || strings.HasPrefix(p, "//")
	}
	return path.IsAbs(p)
}

// cutPrefix is strings.CutPrefix, case-insensitive on Windows.
func cutPrefix(s, prefix string, windows bool) (string, bool) {
	if windows && len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return strings.CutPrefix(s, prefix)
}

// ValidUID accepts the pod UIDs the kubelet produces: an RFC 4122 UUID in its
// lowercase text form (the API server's, 8-4-4-4-12 hex digits) or, for a
// static pod, the 32 lowercase hex digits of the kubelet's hash of the pod.
//
// Only these shapes keep volume handles unique: the handle is
// sha256(podUID + volumeName) without a separator (the kubelet's formula), so
// UIDs of free length would let pod "aaaa1" volume "b" and pod "aaaa" volume
// "1b" share one. With fixed-length UIDs of these two shapes (a UUID has
// hyphens where a static pod's hash has none) no two pods' volumes collide.
func ValidUID(s string) bool {
	switch len(s) {
	case 36:
		for i := range len(s) {
			if i == 8 || i == 13 || i == 18 || i == 23 {
				if s[i] != '-' {
					return false
				}
			} else if !isLowerHex(s[i]) {
				return false
			}
		}
		return true
	case 32:
		for i := range len(s) {
			if !isLowerHex(s[i]) {
				return false
			}
		}
		return true
	}
	return false
}

func isLowerHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

// validVolumeName accepts a DNS-1123 label, which the API server enforces for
// pod volume names.
func validVolumeName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && i > 0 && i < len(s)-1
		if !ok {
			return false
		}
	}
	return true
}
