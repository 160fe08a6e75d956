package main

import (
	"fmt"
	"io"

	"github.com/ephemera-csi/ephemera/drivers/scratch/internal/buildinfo"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// commit is the git commit the Makefile passes with -ldflags "-X
// main.commit=...", for builds the Go toolchain stamps no VCS information
// into (-buildvcs=false, or a source tree without .git).
var commit string

// readBuildInfo reads the version the Makefile set and what the Go toolchain
// stamped into the binary (go version -m shows the same).
func readBuildInfo() buildinfo.Info { return buildinfo.Read(version, commit) }

// printVersion writes the build's version, commit and Go version, and the
// state files it reads.
func printVersion(w io.Writer, b buildinfo.Info) {
	b.Print(w, "ephemera-scratch")
	// A file or record of a newer version is refused (docs/operations.md,
	// "Versions and the state file").
	fmt.Fprintf(w, "state file: schema %d, records version %d\n", boltstore.SchemaVersion, store.RecordVersion)
}
