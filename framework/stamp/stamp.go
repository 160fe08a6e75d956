package stamp

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// FileName is the stamp's file in the storage directory. Backends' inventories
// skip it (it is not a volume).
const FileName = ".ephemera-store-id"

// maxLen bounds what Read accepts: identities are short.
const maxLen = 256

// Read returns the identity stamped in dir, or "" when dir or the stamp does
// not exist.
func Read(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading storage stamp: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if len(id) > maxLen || strings.ContainsAny(id, "\n\x00") {
		return "", fmt.Errorf("storage stamp %s is malformed", filepath.Join(dir, FileName))
	}
	return id, nil
}

// Write durably stamps dir (created 0700 if missing) with id: a new file is
// written, synced and renamed over the old one, and the directory synced.
func Write(dir, id string) error {
	if id == "" || len(id) > maxLen || strings.ContainsAny(id, "\n\x00") {
		return fmt.Errorf("invalid storage stamp %q", id)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, FileName+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.WriteString(id + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing storage stamp: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, FileName)); err != nil {
		return fmt.Errorf("writing storage stamp: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil && !errors.Is(err, os.ErrInvalid) { // Windows cannot sync a directory
			return fmt.Errorf("syncing %s: %w", dir, err)
		}
	}
	return nil
}
