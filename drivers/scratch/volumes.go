package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/scratch/internal/volumetable"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

const volumesUsage = `usage: ephemera-scratch volumes [flags]

Lists the volumes this node's driver holds: volume ID, pod, volume name,
backend, size, usage (mounted volumes with a filesystem of their own), phase and
age. Read-only, and safe while the driver runs:

  1. it asks the running driver (GET /volumes on its --metrics-address,
     --address here);
  2. when no driver answers there, it reads the state file under --state-dir
     read-only (bbolt's shared lock, which a running driver's exclusive lock
     excludes: then it gives up after --timeout rather than wait).

`

// volumesCommand runs "ephemera-scratch volumes"; it returns the exit code.
func volumesCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("volumes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, volumesUsage)
		fs.PrintDefaults()
	}
	driverName := fs.String("driver-name", DriverName, "CSI driver name (selects the default state dir).")
	stateDir := fs.String("state-dir", "", "The driver's state dir. Default "+framework.DefaultStateDir("<driver-name>")+".")
	kubeletRoot := fs.String("kubelet-root", "/var/lib/kubelet", "The kubelet's --root-dir (to check the targets when reading the state file).")
	address := fs.String("address", "127.0.0.1:9809", "The running driver's --metrics-address (host:port); empty: read the state file only.")
	output := fs.String("o", "table", "Output: table or json.")
	timeout := fs.Duration("timeout", 2*time.Second, "How long to wait for the driver's answer, and for the state file's shared lock.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "-o %q: want table or json\n", *output)
		return 2
	}
	if *stateDir == "" {
		*stateDir = framework.DefaultStateDir(*driverName)
	}

	list, from, err := listVolumes(*address, filepath.Join(*stateDir, framework.StateFile), *kubeletRoot, *timeout)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stderr, "from %s\n", from)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(list); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	}
	if err := printVolumes(stdout, list, time.Now()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// listVolumes asks the driver at address, and reads the state file at path
// when nothing answers there. from says which one it used.
func listVolumes(address, path, kubeletRoot string, timeout time.Duration) (list *api.VolumeList, from string, err error) {
	var askErr error
	if address != "" {
		list, askErr = askDriver(address, timeout)
		if askErr == nil {
			return list, "the running driver at " + address, nil
		}
		var unavailable *driverUnavailableError
		if !errors.As(askErr, &unavailable) {
			return nil, "", askErr
		}
	}
	noAnswer := "--address is empty"
	if address != "" {
		noAnswer = fmt.Sprintf("no driver answers at %s (%v)", address, askErr)
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("%s and there is no state file at %s (are --address, --state-dir or --driver-name right?)", noAnswer, path)
	}
	rep, err := boltstore.Inspect(path, boltstore.InspectOptions{Timeout: timeout})
	if errors.Is(err, boltstore.ErrLocked) {
		return nil, "", fmt.Errorf("a driver holds %s, but %s: pass its --metrics-address as --address", path, noAnswer)
	}
	if rep == nil {
		return nil, "", err
	}
	from = "the state file " + path + " (no driver answers at " + address + ")"
	if address == "" {
		from = "the state file " + path
	}
	if err != nil {
		// A damaged file: list what could be read, and say so.
		from += fmt.Sprintf("; DAMAGED, listing what could be read: %v", err)
	}
	return &api.VolumeList{Volumes: framework.DescribeVolumes(rep.Records, kubeletRoot, mount.New())}, from, nil
}

// driverUnavailableError is a driver that did not answer at all (nothing
// listens, or it timed out): the state file is read instead.
type driverUnavailableError struct{ err error }

func (e *driverUnavailableError) Error() string { return e.err.Error() }
func (e *driverUnavailableError) Unwrap() error { return e.err }

// askDriver gets GET /volumes from the driver's metrics address.
func askDriver(address string, timeout time.Duration) (*api.VolumeList, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/volumes", nil)
	if err != nil {
		return nil, fmt.Errorf("--address %q: %v", address, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, &driverUnavailableError{err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, &driverUnavailableError{err}
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("the driver at %s does not serve /volumes (%s): it runs with --volumes-endpoint=false, or is older than this binary (then use the binary of the running image)", address, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("the driver at %s: %s: %s", address, resp.Status, strings.TrimSpace(string(body)))
	}
	list := new(api.VolumeList)
	if err := json.Unmarshal(body, list); err != nil {
		return nil, fmt.Errorf("the driver at %s: decoding /volumes: %v", address, err)
	}
	return list, nil
}

// printVolumes writes list as a table.
func printVolumes(w io.Writer, list *api.VolumeList, now time.Time) error {
	return volumetable.Print(w, volumetable.Rows("", list), false, now)
}
