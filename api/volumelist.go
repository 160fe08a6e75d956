package api

import "time"

// The types of the driver's GET /volumes, in JSON: the contract between a
// driver and the tools that read it (ephemera-scratch volumes, kubectl
// ephemera volumes), which may be of other versions. Fields are only added.

// VolumeList is what a node holds: the body of the driver's GET /volumes (see
// the driver's Handler) and what framework.DescribeVolumes builds from a state file.
type VolumeList struct {
	// Driver and Node are the driver's name and node ID; empty when the list
	// was read from a state file.
	Driver string `json:"driver,omitempty"`
	Node   string `json:"node,omitempty"`
	// Version is the driver's Options.Node.Version; empty from a state file.
	Version string `json:"version,omitempty"`
	// Volumes are ordered by volume ID.
	Volumes []VolumeInfo `json:"volumes"`
}

// VolumeInfo is one volume of a [VolumeList]: what its record says, and its
// usage when it is mounted. It holds no attributes and no secrets.
type VolumeInfo struct {
	VolumeID   string `json:"volumeID"`
	Pod        Pod    `json:"pod"` // Namespace and Name are empty in a rebuilt record
	VolumeName string `json:"volumeName,omitempty"`
	Backend    string `json:"backend"`
	// Size is the volume's size in bytes; 0 when it has none (a dir volume).
	Size int64 `json:"size,omitempty"`
	// Phase is the record's phase (Published, Publishing, Unpublishing,
	// Unclaimed: framework/store.Phase).
	Phase string `json:"phase"`
	// Rebuilt marks a record rebuilt from the node (framework/store.Record.Rebuilt).
	Rebuilt    bool      `json:"rebuilt,omitempty"`
	TargetPath string    `json:"targetPath,omitempty"`
	Created    time.Time `json:"created"`
	// Mounted says whether the target is a mount point (a link on Windows)
	// now; false for a volume that is not Published.
	Mounted bool `json:"mounted"`
	// Usage is the filesystem's usage (statfs of the target) of a mounted
	// volume with a filesystem of its own (tmpfs, loop, vhdx); nil otherwise,
	// and for dir volumes, whose statfs would be the host's (their usage needs
	// a walk: NodeGetVolumeStats does it).
	Usage *VolumeUsage `json:"usage,omitempty"`
	// Error says why Mounted or Usage could not be read; empty when they were.
	Error string `json:"error,omitempty"`
	// ProvisioningSince is when the Create of a long provisioning backend
	// (framework.LongProvisioner) that still runs in the background started;
	// nil otherwise. Only the running driver knows it.
	ProvisioningSince *time.Time `json:"provisioningSince,omitempty"`
}

// VolumeUsage is a filesystem's usage in bytes and inodes.
type VolumeUsage struct {
	BytesTotal  int64 `json:"bytesTotal"`
	BytesUsed   int64 `json:"bytesUsed"`
	BytesAvail  int64 `json:"bytesAvailable"`
	InodesTotal int64 `json:"inodesTotal,omitempty"`
	InodesUsed  int64 `json:"inodesUsed,omitempty"`
}
