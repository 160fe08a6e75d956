package drivertest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// vol_data.json, the file the kubelet keeps beside each CSI volume's target.
const (
	kubeletEphemeralMode = "Ephemeral"
)

// Keys of vol_data.json.
const (
	volDataSpecVolID     = "specVolID"
	volDataVolumeHandle  = "volumeHandle"
	volDataDriverName    = "driverName"
	volDataNodeName      = "nodeName"
	volDataAttachmentID  = "attachmentID"
	volDataLifecycleMode = "volumeLifecycleMode"
)

// writeVolData writes vol_data.json like the kubelet's saveVolumeData: a JSON
// object of strings followed by a newline, created with mode 0666 (before umask).
func (k *Kubelet) writeVolData(dir, specVolID, handle string) error {
	data := map[string]string{
		volDataSpecVolID:     specVolID,
		volDataVolumeHandle:  handle,
		volDataDriverName:    k.driverName,
		volDataNodeName:      k.nodeName,
		volDataAttachmentID:  attachmentID(handle, k.driverName, k.nodeName),
		volDataLifecycleMode: kubeletEphemeralMode,
	}
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, volume.VolDataFile), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

func readVolData(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, volume.VolDataFile))
	if err != nil {
		return nil, err
	}
	var data map[string]string
	if err := json.Unmarshal(b, &data); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", volume.VolDataFile, err)
	}
	return data, nil
}

// attachmentID is the kubelet's getAttachmentName: "csi-" + hex(sha256(handle +
// driver + node)).
func attachmentID(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}
