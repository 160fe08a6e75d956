package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// buildInfo is what "ephemera-scratch version" prints.
type buildInfo struct {
	Version   string // main.version, set by the Makefile's -ldflags; "dev" otherwise
	Commit    string // vcs.revision, with "-dirty" for a modified tree; "" when unknown
	BuildTime string // vcs.time (the commit's time)
	GoVersion string
	Platform  string
}

// commit is the git commit the Makefile passes with -ldflags "-X
// main.commit=...", for builds the Go toolchain stamps no VCS information
// into (-buildvcs=false, or a source tree without .git).
var commit string

// readBuildInfo reads the version the Makefile set and what the Go toolchain
// stamped into the binary (runtime/debug.ReadBuildInfo: the VCS revision when
// built inside the git tree without -buildvcs=false; go version -m shows the
// same), falling back to main.commit.
func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.Commit = ""
	b.GoVersion = bi.GoVersion
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.BuildTime = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if b.Commit != "" && modified {
		b.Commit += "-dirty"
	}
	if b.Commit == "" {
		b.Commit = commit
	}
	return b
}

// printVersion writes the build's version, commit and Go version.
func printVersion(w io.Writer, b buildInfo) {
	commit := b.Commit
	if commit == "" {
		commit = "unknown (built without VCS information)"
	}
	fmt.Fprintf(w, "ephemera-scratch %s\n", b.Version)
	fmt.Fprintf(w, "git commit: %s\n", commit)
	if b.BuildTime != "" {
		fmt.Fprintf(w, "commit time: %s\n", b.BuildTime)
	}
	fmt.Fprintf(w, "go: %s %s\n", b.GoVersion, b.Platform)
	// What state files it reads: a file or record of a newer version is
	// refused (docs/operations.md, "Versions and the state file").
	fmt.Fprintf(w, "state file: schema %d, records version %d\n", boltstore.SchemaVersion, store.RecordVersion)
}
