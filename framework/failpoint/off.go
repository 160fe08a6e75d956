//go:build !failpoints

package failpoint

// Hit does nothing in builds without the "failpoints" tag.
func Hit(string) {}

// Enabled reports whether failpoints are compiled in.
const Enabled = false

// SetHook does nothing in builds without the "failpoints" tag.
func SetHook(func(name string)) {}
