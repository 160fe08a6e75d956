// Package registration registers a CSI driver with the kubelet by itself, using
// the kubelet plugin registration protocol (k8s.io/kubelet/pkg/apis/pluginregistration/v1).
// A driver that uses it does not need the node-driver-registrar sidecar.
//
// # How the kubelet registers a plugin
//
// The kubelet watches <kubelet-root>/plugins_registry (for example
// /var/lib/kubelet/plugins_registry or C:\var\lib\kubelet\plugins_registry)
// for new UNIX domain sockets. It ignores file names that start with a dot.
// When a socket appears, the kubelet:
//
//  1. dials it;
//  2. calls GetInfo (with a 1 s timeout) to learn the plugin type, name,
//     endpoint and supported versions;
//  3. for a CSIPlugin, dials the endpoint and calls the CSI NodeGetInfo RPC,
//     then updates the CSINode object;
//  4. calls NotifyRegistrationStatus with the result.
//
// Deleting the socket makes the kubelet deregister the plugin.
//
// # Socket layouts
//
// The kubelet supports two layouts:
//
//   - Two sockets (what this package does, and what node-driver-registrar does):
//     a registration socket <RegistrationDir>/<DriverName>-reg.sock serves only
//     the Registration service, and GetInfo returns Endpoint, the host path of the
//     driver's CSI socket (for example
//     /var/lib/kubelet/plugins/<DriverName>/csi.sock).
//   - One socket: a socket in plugins_registry serves Registration and the CSI
//     Identity and Node services together, and GetInfo returns an empty endpoint,
//     so the kubelet uses the registration socket as the CSI endpoint. This
//     package does not support it.
//
// Options.Endpoint must be a path as the kubelet sees it on the host, because
// the kubelet dials it. In a container that is not a Windows HostProcess
// container, that is usually not the path the driver listens on.
//
// # Ordering
//
// Start the Registrar only after the driver's CSI server is serving, so that
// NodeGetInfo already works when the kubelet calls it during registration.
// Otherwise the kubelet reports a failure, and Run returns an error wrapping
// ErrRegistrationFailed.
//
// # Failures and shutdown
//
// When the kubelet reports a failed registration, Run logs the kubelet's error,
// removes the socket and returns an error wrapping ErrRegistrationFailed. The
// driver should then exit with a non-zero status so that it is restarted, as
// node-driver-registrar does. When the context given to Run ends, Run stops the
// gRPC server, removes the socket (so the kubelet deregisters the driver) and
// returns nil.
//
// On start, Run deletes a stale socket left at the socket path by an earlier
// instance: one on which a connect is refused. A socket that accepts a
// connection belongs to a live process (this driver running twice on the
// node, or node-driver-registrar for the same driver): Run refuses to take it
// over and returns an error saying so. It refuses to delete anything there that
// is not a socket (on Windows, where socket files are not reliably reported as
// such, only the connect decides). On exit it deletes the socket only if it is
// still the one it created (same device and inode), so that a terminating old
// instance does not remove the socket of a newer one.
//
// # Side by side with node-driver-registrar
//
// The Registrar uses the same socket name as node-driver-registrar, and the
// kubelet cannot tell them apart. Both can be deployed in one cluster for
// different drivers, but never enable both for one driver name on one node:
// the Registrar refuses to start while node-driver-registrar serves the
// socket, but node-driver-registrar deletes the Registrar's socket on its
// start, and the kubelet then sees the driver deregistered.
//
// # Windows
//
// The package works on Windows, where Go supports UNIX domain sockets. The
// Windows kubelet detects a socket by dialing it, which works because the socket
// accepts connections as soon as it exists. The socket permissions are not
// changed on Windows; protect RegistrationDir with an ACL instead. Kubernetes
// v1.23.10, v1.24.4, v1.25.0 or later is needed there (kubernetes#110075).
package registration
