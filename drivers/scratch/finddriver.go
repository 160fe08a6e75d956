package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ephemera-csi/ephemera/framework"
)

// The environment variables "ephemera-scratch volumes" reads for the flags
// not given: each stands for the flag of its name.
const (
	envAddress     = "EPHEMERA_ADDRESS"
	envStateDir    = "EPHEMERA_STATE_DIR"
	envKubeletRoot = "EPHEMERA_KUBELET_ROOT"
	envDriverName  = "EPHEMERA_DRIVER_NAME"
)

// driverPlace is where a driver keeps its state and answers: what the
// volumes command needs of the driver it belongs to.
type driverPlace struct {
	driverName  string
	stateDir    string
	kubeletRoot string
	address     string // host:port of its --metrics-address; "" when it serves none
}

// locator finds the driver a command belongs to: the running driver of the
// same executable (from procRoot, Linux's /proc), else the layout `make run`
// leaves beside the executable (DIR/bin/ephemera-scratch with DIR/state).
type locator struct {
	procRoot string                      // "/proc"; "" to look for no process
	exe      string                      // this executable; "" when unknown
	getenv   func(string) string         // os.Getenv
	self     int                         // this process's pid, never a driver
	sameFile func(a, b os.FileInfo) bool // os.SameFile
}

func systemLocator() locator {
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	}
	return locator{procRoot: "/proc", exe: exe, getenv: os.Getenv, self: os.Getpid(), sameFile: os.SameFile}
}

// runningDriver is a process of this executable serving as a driver.
type runningDriver struct {
	pid   int
	place driverPlace
}

// running lists the processes of the executable that run as a driver (not
// one of its commands), with the place their command lines give. Processes
// it may not read (another user's) are left out.
func (l locator) running() []runningDriver {
	if l.procRoot == "" || l.exe == "" {
		return nil
	}
	self, err := os.Stat(l.exe)
	if err != nil {
		return nil
	}
	entries, err := os.ReadDir(l.procRoot)
	if err != nil {
		return nil
	}
	var found []runningDriver
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == l.self {
			continue
		}
		fi, err := os.Stat(filepath.Join(l.procRoot, e.Name(), "exe"))
		if err != nil || !l.sameFile(self, fi) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.procRoot, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 1 && slices.Contains([]string{"volumes", "state", "version"}, args[1]) {
			continue // a command, not a driver
		}
		if p, ok := placeOf(args[1:]); ok {
			found = append(found, runningDriver{pid: pid, place: p})
		}
	}
	slices.SortFunc(found, func(a, b runningDriver) int { return a.pid - b.pid })
	return found
}

// placeOf reads a driver's place from its arguments with the driver's own
// flags and defaults; flags of others (klog's --v) are skipped.
func placeOf(args []string) (driverPlace, bool) {
	var c config
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.bindFlags(fs)
	if fs.Parse(knownFlags(fs, args)) != nil {
		return driverPlace{}, false
	}
	p := driverPlace{driverName: c.opts.DriverName, stateDir: c.opts.Node.StateDir, kubeletRoot: c.opts.Node.KubeletRootDir,
		address: dialable(c.opts.Observability.MetricsAddress)}
	if p.stateDir == "" {
		p.stateDir = framework.DefaultStateDir(p.driverName)
	}
	if p.kubeletRoot == "" {
		p.kubeletRoot = c.kubeletRoot
	}
	return p, true
}

// knownFlags keeps of args the flags fs defines, with their values.
func knownFlags(fs *flag.FlagSet, args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") {
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		// A flag given as "--name value" takes the next argument with it.
		takesNext := !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-")
		if f != nil {
			if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
				takesNext = false
			}
			out = append(out, a)
			if takesNext {
				out = append(out, args[i+1])
			}
		}
		if takesNext {
			i++
		}
	}
	return out
}

// dialable turns a listen address into one to dial on this host: the
// unspecified host (":9809", "0.0.0.0:9809", "[::]:9809") is loopback.
func dialable(listen string) string {
	if listen == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if ip != nil && ip.To4() == nil {
			return net.JoinHostPort("::1", port)
		}
		return net.JoinHostPort("127.0.0.1", port)
	}
	return listen
}

// madeByRun is the place `make run` gives its driver when the executable is
// DIR/bin/NAME and DIR/state holds a state file (test/walkthrough: state in
// DIR/state, the kubelet root DIR/kubelet).
func (l locator) madeByRun() (driverPlace, bool) {
	if l.exe == "" || filepath.Base(filepath.Dir(l.exe)) != "bin" {
		return driverPlace{}, false
	}
	dir := filepath.Dir(filepath.Dir(l.exe))
	state := filepath.Join(dir, "state")
	if _, err := os.Stat(filepath.Join(state, framework.StateFile)); err != nil {
		return driverPlace{}, false
	}
	return driverPlace{driverName: DriverName, stateDir: state, kubeletRoot: filepath.Join(dir, "kubelet")}, true
}

// setting is one value of the command: what it is and where it came from.
type setting struct {
	value, from string
}

// resolve fills each setting the flags left unset (set says which they
// set): from the environment, then the running driver of this executable
// (the only one, or the one of --driver-name), then `make run`'s layout,
// then the defaults in s. It returns a line saying what it found, for the
// user ("" when it found nothing).
func (l locator) resolve(s map[string]*setting, set map[string]bool) (string, error) {
	env := map[string]string{"address": envAddress, "state-dir": envStateDir, "kubelet-root": envKubeletRoot, "driver-name": envDriverName}
	for name, v := range env {
		if !set[name] && l.getenv(v) != "" {
			s[name].value, s[name].from = l.getenv(v), "$"+v
			set[name] = true
		}
	}
	if set["address"] && set["state-dir"] && set["kubelet-root"] {
		return "", nil
	}
	fill := func(p driverPlace, from string) {
		for name, v := range map[string]string{"address": p.address, "state-dir": p.stateDir, "kubelet-root": p.kubeletRoot, "driver-name": p.driverName} {
			if !set[name] {
				s[name].value, s[name].from = v, from
			}
		}
	}
	drivers := l.running()
	if set["driver-name"] {
		drivers = slices.DeleteFunc(drivers, func(d runningDriver) bool { return d.place.driverName != s["driver-name"].value })
	}
	switch len(drivers) {
	case 0:
	case 1:
		d := drivers[0]
		fill(d.place, fmt.Sprintf("the command line of driver process %d", d.pid))
		if d.place.address == "" && !set["address"] {
			return "", fmt.Errorf("the driver (process %d) serves no --metrics-address, and holds its state file %s while it runs: its volumes can be listed once it runs with --metrics-address (or from the file once it stops)",
				d.pid, filepath.Join(d.place.stateDir, framework.StateFile))
		}
		return fmt.Sprintf("found the driver of this binary: process %d (--driver-name %s, --state-dir %s, --metrics-address %s)",
			d.pid, d.place.driverName, d.place.stateDir, d.place.address), nil
	default:
		var b bytes.Buffer
		for _, d := range drivers {
			fmt.Fprintf(&b, "\n  process %d: --driver-name %s --state-dir %s --address %s", d.pid, d.place.driverName, d.place.stateDir, d.place.address)
		}
		return "", fmt.Errorf("%d drivers of this binary run; choose one with --driver-name, or --address and --state-dir:%s", len(drivers), b.String())
	}
	if p, ok := l.madeByRun(); ok && !set["state-dir"] {
		fill(p, "`make run`'s layout beside "+l.exe)
		// The walkthrough's driver is stopped: its state file is what there is.
		if s["address"].from == "`make run`'s layout beside "+l.exe {
			s["address"].value = ""
		}
		return fmt.Sprintf("no driver of this binary runs; `make run`'s state beside it: %s", p.stateDir), nil
	}
	return "", nil
}
