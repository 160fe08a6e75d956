// Package fakecsiproxy is a fake csi-proxy for tests of the csi-proxy v1 seam
// (mount.NewCSIProxy) on any platform: csi-proxy v1's filesystem API
// (github.com/kubernetes-csi/csi-proxy/client/api/filesystem/v1) served over
// a unix socket, each call done on the local filesystem the way csi-proxy
// v1.3.0 does it on Windows and recorded. [Start] returns the [Server];
// [Server.Calls] returns what it received, as [Call] values.
//
// # What it copies from csi-proxy v1.3.0
//
//   - Path checks (validatePathWindows): at most 260 bytes, absolute, no ".."
//     anywhere, and a case-insensitive string prefix of one of the working
//     directories, with no separator boundary (C:\var\lib\kubeletX passes for
//     C:\var\lib\kubelet). IsSymlink checks no path.
//   - What each call does: PathExists is an lstat; Mkdir is os.MkdirAll(0755);
//     Rmdir is os.Remove, or os.RemoveAll with force; CreateSymlink is
//     os.Symlink(source_path, target_path), so target_path must not exist;
//     IsSymlink is true only for a link (or a mount point) whose destination
//     exists, and fails for a path that does not exist.
//   - Failures are plain errors, which gRPC sends as codes.Unknown with the
//     message, as csi-proxy's are.
//
// Windows' own path rules (drive letters, the characters csi-proxy refuses)
// are not checked: the paths here are the host's.
package fakecsiproxy
