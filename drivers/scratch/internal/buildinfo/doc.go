// Package buildinfo reads and prints what a binary of the scratch driver's
// (ephemera-scratch, kubectl-ephemera) was built from: Read returns an Info of
// the version the Makefile's -ldflags set, the commit the Go toolchain stamped
// and the toolchain; Info.Print writes it as their "version" commands do.
package buildinfo
