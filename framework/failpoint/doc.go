// Package failpoint lets crash tests kill the driver at a named side-effect
// boundary. It is compiled in only with the build tag "failpoints"; in normal
// builds Hit is an empty function the compiler removes, so production binaries
// carry no test branch. It has no types: [Hit], and [SetHook] for tests.
//
// Backends declare their own failpoints the same way (drivers/loop kills itself
// between attaching a loop device and mkfs, for example) so that their authors can
// prove their Create and Delete are idempotent across a kill -9.
//
// With the tag, EPHEMERA_FAILPOINT=name[,name...] makes Hit(name) send SIGKILL to
// the process, which is exactly what a node's OOM killer or a kill -9 does.
package failpoint
