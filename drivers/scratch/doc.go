// Command ephemera-scratch is a ready-to-run ephemeral inline CSI driver that gives
// every pod volume its own scratch space: a size-limited tmpfs (default) or a
// directory under the driver's state dir. On Windows the backends are dir
// (default) and vhdx (an NTFS volume of its own with a hard size); it then runs
// as a HostProcess container (deploy/overlays/windows-hostprocess), or, with
// --windows-mode=csi-proxy, as an ordinary Windows container that changes the
// host only through csi-proxy v1 (dir backend only; deploy/overlays/windows-csi-proxy).
//
//	volumes:
//	- name: scratch
//	  csi:
//	    driver: scratch.csi.ephemera.dev
//	    volumeAttributes: {size: 256Mi}        # backend: tmpfs | loop | dir
package main
