// Package unixsock listens on a UNIX socket file without taking over another
// process's socket, and removes on close only the socket file it created:
// [Listen] returns a [Listener] that does both; [CheckNotServed] and
// [DialGRPC] are the checks and the dial that go with it.
//
// The driver's CSI endpoint and the kubelet registration socket both use it.
// Two processes serving the same path happen: a second pod of the DaemonSet on
// the node (a rolling update with maxSurge, two DaemonSets with the same driver
// name), or an old process that was not stopped. Removing a live socket leaves
// its process running and ready but unreachable; removing the newer process's
// socket on exit does the same to it.
package unixsock
