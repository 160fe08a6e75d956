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

Lists the volumes this node's driver holds: volume ID (short; -o wide: whole,
with the pod's UID and the target), pod, volume name, backend, size, usage
(mounted volumes with a filesystem of its own), phase and age. Read-only, and
safe while the driver runs:

  1. it asks the running driver (GET /volumes on its --metrics-address,
     --address here);
  2. when no driver answers there, it reads the state file under --state-dir
     read-only (bbolt's shared lock, which a running driver's exclusive lock
     excludes: then it gives up after --timeout rather than wait).

It finds the driver it belongs to: each flag not given is taken from the
environment (EPHEMERA_ADDRESS, EPHEMERA_STATE_DIR, EPHEMERA_KUBELET_ROOT,
EPHEMERA_DRIVER_NAME), else from the command line of the running driver of
this same binary (in the driver's container, or the one ` + "`make run`" + ` starts),
else from ` + "`make run`" + `'s layout beside the binary (DIR/bin/ephemera-scratch
with DIR/state), else the defaults below.

`

// volumesCommand runs "ephemera-scratch volumes"; it returns the exit code.
func volumesCommand(args []string, stdout, stderr io.Writer) int {
	return systemLocator().volumesCommand(args, stdout, stderr)
}

func (l locator) volumesCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("volumes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, volumesUsage)
		fs.PrintDefaults()
	}
	s := map[string]*setting{
		"driver-name":  {value: DriverName, from: "the default"},
		"state-dir":    {from: "the default"},
		"kubelet-root": {value: "/var/lib/kubelet", from: "the default"},
		"address":      {value: "127.0.0.1:9809", from: "the default"},
	}
	fs.StringVar(&s["driver-name"].value, "driver-name", s["driver-name"].value, "CSI driver name (selects the default state dir, and the running driver when several run).")
	fs.StringVar(&s["state-dir"].value, "state-dir", "", "The driver's state dir. Default "+framework.DefaultStateDir("<driver-name>")+".")
	fs.StringVar(&s["kubelet-root"].value, "kubelet-root", s["kubelet-root"].value, "The kubelet's --root-dir (to check the targets when reading the state file).")
	fs.StringVar(&s["address"].value, "address", s["address"].value, "The running driver's --metrics-address (host:port); empty: read the state file only.")
	output := fs.String("o", "table", "Output: table (short volume IDs), wide (whole IDs, pod UIDs, targets) or json.")
	timeout := fs.Duration("timeout", 2*time.Second, "How long to wait for the driver's answer, and for the state file's shared lock.")
	verbose := fs.Bool("v", false, "Say where each setting came from.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *output != "table" && *output != "wide" && *output != "json" {
		fmt.Fprintf(stderr, "-o %q: want table, wide or json\n", *output)
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		if _, ok := s[f.Name]; ok {
			set[f.Name] = true
			s[f.Name].from = "--" + f.Name
		}
	})
	found, err := l.resolve(s, set)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if found != "" {
		fmt.Fprintln(stderr, found)
	}
	if s["state-dir"].value == "" {
		s["state-dir"].value = framework.DefaultStateDir(s["driver-name"].value)
	}
	if *verbose {
		for _, name := range []string{"address", "state-dir", "kubelet-root", "driver-name"} {
			fmt.Fprintf(stderr, "--%s=%s (from %s)\n", name, s[name].value, s[name].from)
		}
	}

	list, from, err := listVolumes(s["address"].value, filepath.Join(s["state-dir"].value, framework.StateFile), s["kubelet-root"].value, *timeout)
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
	if err := volumetable.Print(stdout, volumetable.Rows("", list), false, *output == "wide", time.Now()); err != nil {
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
