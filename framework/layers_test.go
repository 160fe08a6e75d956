package framework_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// layers orders the module's packages: a package may import only packages of
// a lower layer (never its own, never a higher one), so the import graph is
// the architecture and a call that climbs back up cannot compile. Layer 0 is
// the leaves: they import nothing of the module. A package missing here fails
// TestLayers: place it.
var layers = map[string]int{
	// Leaves.
	"api/plugin/v1alpha1":                        0,
	"framework/failpoint":                        0,
	"framework/stamp":                            0,
	"framework/events/eventstest":                0,
	"framework/mount/fakecsiproxy":               0,
	"framework/internal/admission":               0,
	"framework/internal/exepages":                0,
	"framework/internal/logkeys":                 0,
	"framework/internal/metrics":                 0,
	"framework/internal/podcgroup":               0,
	"framework/internal/spread":                  0,
	"framework/internal/podcgroup/podcgrouptest": 1,
	"framework/internal/mounttest":               0,
	"framework/internal/unixsock":                0,
	"framework/internal/winpath":                 0,
	"framework/internal/words":                   0,
	"drivers/scratch/internal/buildinfo":         0,
	"api":                                        1,
	"framework/store":                            2,
	"framework/content":                          2,
	"framework/events":                           2,
	"framework/kube":                             2,
	"framework/registration":                     2,
	"framework/internal/csidriver":               2,
	"framework/internal/httpserver":              2,
	"framework/internal/stats":                   2,
	"framework/store/boltstore":                  3,
	"framework/store/memstore":                   3,
	"framework/store/storetest":                  3,
	"framework/internal/volume":                  3,
	"framework/mount":                            4,
	"framework/internal/errkind":                 5,
	"drivers/dir":                                5,
	"drivers/loop":                               5,
	"drivers/tmpfs":                              5,
	"drivers/vhdx":                               5,
	"drivers/scratch/internal/volumetable":       5,
	// The lifecycle's collaborators that are packages of their own.
	"framework/internal/capacity":  6,
	"framework/internal/lanes":     6,
	"framework/internal/volstats":  6,
	"framework/internal/refresh":   6,
	"framework/internal/storage":   6,
	"framework/internal/provision": 6,
	"framework/internal/reconcile": 6,
	// A collaborator over the lanes: content charged to their budget and
	// capacity.
	"framework/internal/fill": 7,
	// The request side and the volume side of the driver: one layer, so
	// that neither can import the other; package framework joins them.
	"framework/internal/csiserver": 8,
	"framework/internal/lifecycle": 8,
	// A driver process: Run's components around the two.
	"framework/internal/daemon": 9,
	// The public surface: Options, New, Run, the extension interfaces.
	"framework":                            10,
	"framework/plugin":                     11,
	"framework/pluginserver":               12,
	"framework/drivertest":                 12,
	"framework/backendtest":                13,
	"drivers/scratch":                      13,
	"drivers/scratch/cmd/kubectl-ephemera": 13,
	// The SDK's command line (ephemera new): names checked as the framework
	// checks them, nothing of the framework linked.
	"cmd/ephemera": 2,
}

// TestLayers: every import between the module's packages (test files aside)
// goes down the layers above, on Linux and on Windows.
func TestLayers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	const module = "github.com/ephemera-csi/ephemera/"
	for _, goos := range []string{"linux", "windows"} {
		cmd := exec.Command(goBin, "list", "-e",
			"-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./api/...", "./framework/...", "./drivers/...", "./cmd/...")
		cmd.Dir = root
		cmd.Env = append(cmd.Environ(), "GOOS="+goos, "GOFLAGS=-mod=mod")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GOOS=%s go list: %v\n%s", goos, err, stderr.String())
		}
		n := 0
		for line := range strings.Lines(string(out)) {
			fields := strings.Fields(line)
			pkg := strings.TrimPrefix(fields[0], module)
			from, ok := layers[pkg]
			if !ok {
				t.Errorf("%s: not in layers (layers_test.go): give it the layer above everything it imports", pkg)
				continue
			}
			n++
			for _, imp := range fields[1:] {
				imp, ok := strings.CutPrefix(imp, module)
				if !ok {
					continue
				}
				to, known := layers[imp]
				switch {
				case !known:
					t.Errorf("GOOS=%s: %s imports %s, which is not in layers", goos, pkg, imp)
				case to >= from:
					t.Errorf("GOOS=%s: %s (layer %d) imports %s (layer %d): imports go only down; move what it needs below it", goos, pkg, from, imp, to)
				}
			}
		}
		if n < len(layers)/2 {
			t.Fatalf("GOOS=%s: go list named %d packages of the module, want about %d:\n%s", goos, n, len(layers), out)
		}
	}
}
