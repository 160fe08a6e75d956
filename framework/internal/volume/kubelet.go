package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
)

// volDataMax bounds what is read of a vol_data.json (the kubelet's is ~300 bytes).
const volDataMax = 64 << 10

// Kubelet is what the kubelet's directories say about a driver's inline
// volumes on this node: the vol_data.json it writes beside each target,
// which names the driver and the volume handle.
type Kubelet struct {
	// Root is the kubelet root directory, Driver the driver's name.
	Root, Driver string
	// Windows: target paths are Windows paths.
	Windows bool
	// Open opens a directory beneath Root without following links out of
	// it (mount.Interface.OpenTarget).
	Open func(root, dir string) (*os.Root, error)
}

// ReadVolData reads the kubelet's vol_data.json beside target and returns its
// driver name and volume handle.
func (k Kubelet) ReadVolData(target string) (driver, handle string, err error) {
	r, err := k.Open(k.Root, filepath.Dir(target))
	if err != nil {
		return "", "", err
	}
	defer r.Close()
	f, err := r.Open(VolDataFile)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, volDataMax))
	if err != nil {
		return "", "", err
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return "", "", fmt.Errorf("%s beside %s: %w", VolDataFile, target, err)
	}
	return m["driverName"], m["volumeHandle"], nil
}

// Owned reports whether target is one of the driver's inline volumes
// according to the kubelet: its vol_data.json names the driver and the
// handle derived from the target. It returns the parsed target and the
// handle.
func (k Kubelet) Owned(target string) (Target, string, bool) {
	t, err := ParseTarget(k.Root, target, k.Windows)
	if err != nil {
		return Target{}, "", false
	}
	id := t.Handle()
	driver, handle, err := k.ReadVolData(target)
	if err != nil || driver != k.Driver || handle != id {
		return Target{}, "", false
	}
	return t, id, true
}

// Index maps the handles of the driver's inline volumes that the kubelet has
// on this node (pods/*/volumes/kubernetes.io~csi/*/vol_data.json) to their
// targets.
func (k Kubelet) Index() (map[string]string, error) {
	podsDir := filepath.Join(k.Root, PodsDir)
	r, err := k.Open(k.Root, podsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fsys := r.FS()
	uids, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	index := map[string]string{}
	for _, u := range uids {
		if !u.IsDir() || !ValidUID(u.Name()) {
			continue
		}
		vols, err := fs.ReadDir(fsys, path.Join(u.Name(), VolumesDir, PluginDir))
		if err != nil {
			continue
		}
		for _, vol := range vols {
			if !vol.IsDir() {
				continue
			}
			t := TargetPath(k.Root, u.Name(), vol.Name())
			if _, id, ok := k.Owned(t); ok {
				index[id] = t
			}
		}
	}
	return index, nil
}
