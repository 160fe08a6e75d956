package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// rebuild is set by "ephemera-scratch state rebuild": the driver recovers its
// state offline (framework.Driver.RebuildState) instead of serving.
var rebuild bool

const stateUsage = `usage: ephemera-scratch state <command> [flags]

Offline tools for a node's driver state (state.db under --state-dir). check and
dump read the file without changing it; they wait for the file lock, so they
need the driver stopped (or give up after --timeout).

  check    validate the state file; exit 0 when healthy, 1 when damaged
  dump     print the records (and quarantined entries) as JSON
  rebuild  move the state file aside (never deleted) and rebuild the state from
           the node: mounts at targets under --kubelet-root, the kubelet's
           vol_data.json and the backends' storage. Takes the driver's own
           flags (--kubelet-root, --backends, ...) so it sees the same storage.
`

// stateCommand runs "state check" and "state dump"; it returns the exit code.
func stateCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, stateUsage)
		return 2
	}
	cmd := args[0]
	fs := flag.NewFlagSet("state "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	driverName := fs.String("driver-name", DriverName, "CSI driver name (selects the default state dir).")
	stateDir := fs.String("state-dir", "", "The driver's state dir. Default "+framework.DefaultStateDir("<driver-name>")+".")
	timeout := fs.Duration("timeout", 2*time.Second, "How long to wait for the state file's lock.")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *stateDir == "" {
		*stateDir = framework.DefaultStateDir(*driverName)
	}
	path := filepath.Join(*stateDir, framework.StateFile)
	switch cmd {
	case "check", "dump":
	default:
		fmt.Fprintf(stderr, "unknown state command %q\n\n%s", cmd, stateUsage)
		return 2
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stderr, "no state file at %s (is --state-dir or --driver-name right?)\n", path)
		return 2
	}
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{Timeout: *timeout})
	if errors.Is(err, boltstore.ErrLocked) {
		fmt.Fprintf(stderr, "%v\n", err)
		return 2
	}
	if cmd == "dump" {
		if rep != nil {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if eerr := enc.Encode(rep); eerr != nil {
				fmt.Fprintf(stderr, "%v\n", eerr)
				return 2
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "%v\n", err)
			return 1
		}
		return 0
	}
	if rep != nil {
		fmt.Fprintf(stdout, "file:           %s (%d bytes, page size %d, txid %d)\n", rep.Path, rep.Size, rep.PageSize, rep.TxID)
		fmt.Fprintf(stdout, "store identity: %s (schema %d)\n", rep.StoreID, rep.SchemaVersion)
		if rep.Writer != "" {
			fmt.Fprintf(stdout, "last opened by: %s\n", rep.Writer)
		}
		if rep.SchemaVersion > boltstore.SchemaVersion {
			fmt.Fprintf(stdout, "NEWER SCHEMA: this binary knows schema %d; a driver of this version refuses the file (docs/operations.md, 'Versions and the state file')\n", boltstore.SchemaVersion)
		}
		fmt.Fprintf(stdout, "records:        %d\n", rep.RecordCount)
		if n := len(rep.Quarantined); n > 0 {
			fmt.Fprintf(stdout, "quarantined:    %d (records that could not be read; their volumes were rebuilt from the node)\n", n)
		}
		if n := len(rep.Undecodable); n > 0 {
			fmt.Fprintf(stdout, "undecodable:    %d (the driver quarantines them at its next start)\n", n)
		}
	}
	if err != nil {
		fmt.Fprintf(stdout, "DAMAGED: %v\n", err)
		fmt.Fprintf(stdout, "The driver rebuilds it at start (--state-recovery=rebuild, the default), or run: ephemera-scratch state rebuild <the driver's flags>\n")
		return 1
	}
	fmt.Fprintln(stdout, "OK")
	return 0
}

// rebuildState runs the offline recovery and reports it.
func rebuildState(ctx context.Context, d *framework.Driver, stdout io.Writer) error {
	aside, err := d.RebuildState(ctx)
	if aside != "" {
		fmt.Fprintf(stdout, "moved the old state file to %s (kept, not deleted)\n", aside)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "state rebuilt from the node; see the log for every volume adopted, kept unclaimed or rolled back")
	return nil
}
