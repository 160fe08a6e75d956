package mount

import (
	"fmt"
	"path/filepath"
	"strings"
)

// splitBeneath checks lexically that target lies strictly below root and returns
// target's path relative to root, split into the parent part ("." when target is a
// direct child of root) and the last component. Both paths must be absolute. It
// uses the host's path rules, so on Windows both separators are accepted and the
// comparison ignores case.
func splitBeneath(root, target string) (parent, base string, err error) {
	if !filepath.IsAbs(root) || !filepath.IsAbs(target) {
		return "", "", fmt.Errorf("target %q and root %q must be absolute paths", target, root)
	}
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(target))
	if err != nil {
		return "", "", fmt.Errorf("target %q is not below root %q: %v", target, root, err)
	}
	if rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", "", fmt.Errorf("target %q is not below root %q", target, root)
	}
	return filepath.Dir(rel), filepath.Base(rel), nil
}
