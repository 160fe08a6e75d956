package buildinfo

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Info is what a "version" command prints.
type Info struct {
	// Version is main.version as the Makefile's -ldflags set it; when that is
	// "dev", the module's version where the binary was built by go install
	// or go run of path@vX.Y.Z.
	Version string
	// Commit is vcs.revision, with "-dirty" for a modified tree; the
	// Makefile's main.commit where the toolchain stamped none (-buildvcs=false,
	// a source tree without .git); "" when unknown.
	Commit    string
	BuildTime string // vcs.time (the commit's time)
	GoVersion string
	Platform  string
}

// Read returns the build's Info, given main.version and main.commit.
func Read(version, commit string) Info {
	b := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.GoVersion = bi.GoVersion
	if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			b.BuildTime = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev != "" {
		if modified {
			rev += "-dirty"
		}
		b.Commit = rev
	}
	return b
}

// Print writes name's version, commit, commit time and Go version, a line each.
func (b Info) Print(w io.Writer, name string) {
	commit := b.Commit
	if commit == "" {
		commit = "unknown (built without VCS information)"
	}
	fmt.Fprintf(w, "%s %s\n", name, b.Version)
	fmt.Fprintf(w, "git commit: %s\n", commit)
	if b.BuildTime != "" {
		fmt.Fprintf(w, "commit time: %s\n", b.BuildTime)
	}
	fmt.Fprintf(w, "go: %s %s\n", b.GoVersion, b.Platform)
}
