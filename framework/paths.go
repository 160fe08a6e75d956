package framework

import (
	"fmt"
	"path"
	"runtime"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
)

var defaultKubeletRoot, defaultStateRoot = func() (string, string) {
	if runtime.GOOS == "windows" {
		return `C:\var\lib\kubelet`, `C:\var\lib\ephemera`
	}
	return "/var/lib/kubelet", "/var/lib/ephemera"
}()

// target is a parsed, validated kubelet target path.
type target struct {
	podUID     string
	volumeName string
}

// normalizePath turns p into a slash-separated, cleaned path for comparison. On
// Windows it accepts either separator, strips the \\?\ long-path prefix, adds the
// C: drive to drive-less paths (as the kubelet's NormalizePath does) and
// lower-cases the drive letter.
func normalizePath(p string, windows bool) string {
	if windows {
		p = strings.ReplaceAll(p, `\`, "/")
		p = strings.TrimPrefix(p, "//?/")
		if strings.HasPrefix(p, "/") {
			p = "c:" + p
		}
		if len(p) >= 2 && p[1] == ':' {
			p = strings.ToLower(p[:1]) + p[1:]
		}
	}
	return p
}

// hasDotDot reports whether any element of the slash-separated path p is "..".
func hasDotDot(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}

// parseTargetPath checks that t is <root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount
// and returns the pod UID and volume name. It is lexical: no file system access.
func parseTargetPath(root, t string, windows bool) (target, error) {
	if t == "" {
		return target{}, fmt.Errorf("target_path is required")
	}
	nt := normalizePath(t, windows)
	nr := path.Clean(normalizePath(root, windows))
	if hasDotDot(nt) {
		return target{}, fmt.Errorf("target_path %q must not contain '..'", t)
	}
	if !isAbsNormalized(nt, windows) {
		return target{}, fmt.Errorf("target_path %q must be absolute", t)
	}
	nt = path.Clean(nt)
	prefix := nr + "/pods/"
	if nr == "/" {
		prefix = "/pods/"
	}
	rest, ok := cutPrefix(nt, prefix, windows)
	if !ok {
		return target{}, fmt.Errorf("target_path %q is not under the kubelet's pods directory %s; is the driver's --kubelet-root set to the kubelet's --root-dir?", t, prefix)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "volumes" || parts[2] != "kubernetes.io~csi" || parts[4] != "mount" {
		return target{}, fmt.Errorf("target_path %q does not have the form %s<pod-uid>/volumes/kubernetes.io~csi/<volume-name>/mount used for inline volumes", t, prefix)
	}
	if !validUID(parts[0]) {
		return target{}, fmt.Errorf("target_path %q: %q is not a pod UID the kubelet produces (a lowercase UUID, or 32 lowercase hex digits for a static pod)", t, parts[0])
	}
	if !validVolumeName(parts[3]) {
		return target{}, fmt.Errorf("target_path %q: %q is not a valid pod volume name (DNS label)", t, parts[3])
	}
	return target{podUID: parts[0], volumeName: parts[3]}, nil
}

func isAbsNormalized(p string, windows bool) bool {
	if windows {
		return len(p) >= 3 && p[0] >= 'a' && p[0] <= 'z' && p[1] == ':' && p[2] == '/'
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

// validUID accepts the pod UIDs the kubelet produces: an RFC 4122 UUID in its
// lowercase text form (the API server's, 8-4-4-4-12 hex digits) or, for a
// static pod, the 32 lowercase hex digits of the kubelet's hash of the pod.
//
// Only these shapes keep volume handles unique: the handle is
// sha256(podUID + volumeName) without a separator (the kubelet's formula), so
// UIDs of free length would let pod "aaaa1" volume "b" and pod "aaaa" volume
// "1b" share one. With fixed-length UIDs of these two shapes (a UUID has
// hyphens where a static pod's hash has none) no two pods' volumes collide.
func validUID(s string) bool {
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

// checkVolumeID verifies that id is the handle the kubelet derives for t.
func checkVolumeID(id string, t target) error {
	if want := api.VolumeHandle(t.podUID, t.volumeName); id != want {
		return fmt.Errorf("volume_id %q does not match target path of pod %s volume %q (expected %s); inline volume handles are derived by the kubelet", id, t.podUID, t.volumeName, want)
	}
	return nil
}
