package drivertest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// removeAllExcept removes everything below dir except the paths in keep and
// the directories leading to them.
func removeAllExcept(dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if keep[p] {
			continue
		}
		if e.IsDir() && hasPathBelow(p, keep) {
			errs = append(errs, removeAllExcept(p, keep))
			continue
		}
		errs = append(errs, os.RemoveAll(p))
	}
	return errors.Join(errs...)
}

// hasPathBelow reports whether one of paths is strictly below dir.
func hasPathBelow(dir string, paths map[string]bool) bool {
	prefix := dir + string(filepath.Separator)
	for p := range paths {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}
