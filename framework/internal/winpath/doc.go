// Package winpath gives a Windows path one spelling, so that the framework
// parses and compares the paths the kubelet sends (either separator, with or
// without a drive, with or without the \\?\ prefix) one way: [Clean] is the one
// spelling, [Key] the case-folded one two paths are compared by, [Slash] the
// one parsed with package path. It is pure string work, tested on every
// platform. Paths handed to Windows itself are normalised the kubelet's way by
// mount.NormalizeWindowsPath instead.
package winpath
