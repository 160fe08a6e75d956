// Package dir is a directory backend ([Backend], built by [New] from
// [Options]): each volume is a directory under the backend's root (normally in
// the driver's state dir), bind-mounted at the pod's target on Linux and linked
// on Windows; through csi-proxy, Options.Host ([Host]) makes its directories.
// It survives driver restarts and node reboots until the volume is unpublished.
//
// A directory cannot enforce a size: the "size" attribute is refused unless
// Options.AllowSoftSize is set, in which case it is recorded but not enforced.
// Use the tmpfs or loop backend for hard limits.
//
// Attributes: "mode" (octal, default 0777), "uid", "gid" (Linux).
package dir
