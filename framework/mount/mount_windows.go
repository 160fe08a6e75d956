//go:build windows

package mount

// New returns the Windows implementation: a directory source is published as a
// directory symbolic link at the target (creating one needs
// SeCreateSymbolicLinkPrivilege, which SYSTEM and Administrators hold, or
// Developer Mode). Filesystem sources and SetReadOnly return ErrNotSupported.
// Incoming paths are normalized with NormalizeWindowsPath. The logic is in
// link.go.
func New() Interface { return newLinkMounter(osFS{}, NormalizeWindowsPath) }
