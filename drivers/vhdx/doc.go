// Package vhdx is a Windows backend with a hard size limit ([Backend], built by
// [New] from [Options]): each volume is a fixed-size VHDX file holding one GPT
// partition formatted NTFS, attached to the node and mounted in a folder under
// the backend's directory. The framework links the pod's target to that folder,
// so the pod sees a directory that cannot grow beyond the volume's size.
// Writing past it fails with "There is not enough space on the disk".
//
// The driver must run as a HostProcess container with SYSTEM rights (see
// deploy/overlays/windows-hostprocess): attaching virtual disks, partitioning,
// formatting and folder mount points are privileged.
//
// # What happens per volume
//
// Create (idempotent; every step reuses what an interrupted call left):
//
//  1. the file <Dir>\<volumeID>.vhdx is created as <volumeID>.vhdx.tmp with
//     virtdisk.dll CreateVirtualDisk (go-winio/vhd) and renamed when complete;
//  2. it is attached with AttachVirtualDisk, flags PermanentLifetime (it stays
//     attached when the driver's handle closes or the driver exits) and
//     NoDriveLetter; GetVirtualDiskPhysicalPath gives \\.\PhysicalDriveN;
//  3. disk N is brought online and partitioned (GPT, one basic partition) with
//     csi-proxy/v2 pkg/disk SetDiskState and PartitionDisk;
//  4. its volume (pkg/volume ListVolumesOnDisk) is formatted NTFS unless it
//     already is (IsVolumeFormatted, FormatVolume);
//  5. the volume is mounted at <Dir>\mnt\<volumeID> (pkg/volume MountVolume:
//     SetVolumeMountPoint), which is what Create returns.
//
// Delete undoes it in reverse: unmount the folder (UnmountVolume: flush, then
// DeleteVolumeMountPoint), detach (DetachVirtualDisk), delete the file and the
// folder; every step is skipped when already done.
//
// Create and Delete stop before their next step once their context ends (the
// framework bounds each publish with Options.Limits.OperationTimeout) and return an
// error wrapping ctx.Err(). A step that has started runs to completion: none of
// the calls can be cancelled (allocating a fixed-size file, formatting), and
// csi-proxy is passed the context but does not use it. The next Create or
// Delete carries on where the stopped one left off; a complete file is renamed
// even past the deadline, so its allocation is never thrown away.
//
// List finds the volumes by their files in Dir and folders in Dir\mnt. Dir
// carries the state store's identity (framework/stamp, .ephemera-store-id),
// written once every volume there has a record, so that a driver restarted on
// that state deletes a volume it finds without a record or a pod instead of
// keeping it as unclaimed.
//
// A VHDX attached with PermanentLifetime does not survive a node reboot: after
// one, the target's link dangles, the framework sees the volume as not
// published and the next NodePublishVolume (the kubelet republishes after it
// restarts) runs Create again, which re-attaches the same file and finds its
// partition, filesystem and data.
//
// # Cost
//
// A fixed-size VHDX allocates (and NTFS zero-fills) the whole file at create:
// node disk for the full size is taken up front, and creating a large volume
// takes time (about the disk's sequential write speed; seconds per GiB on
// ordinary disks). Options.Dynamic creates dynamically expanding files instead:
// fast to create and thin, but the node disk can then be overcommitted and a
// full node disk surfaces as I/O errors inside the pod.
//
// # Attributes
//
// "size" (required unless Options.DefaultSize is set; rounded up to 1MiB; at
// least MinSize) and "fsType" (only "ntfs"). The usable space is a little
// smaller than the size: the GPT partition table, the Microsoft reserved
// partition and NTFS metadata take their share.
//
// # Testing
//
// Everything but the system calls is in files without build tags and is unit
// tested on Linux against a fake of the small host interface (host.go);
// vhdx_windows.go holds the calls, and test/windows/run.ps1 exercises them on
// a real Windows Server node. On other systems Create fails with
// api.ErrNotSupported.
package vhdx
