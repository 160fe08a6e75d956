package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"golang.org/x/mod/module"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, buildVersion()))
}

// buildVersion is the SDK version this command was built from: the main
// module's version, "(devel)" when built in a checkout (also when the go
// command stamped a pseudo-version from the checkout's commit, which no proxy
// need serve).
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	v := bi.Main.Version
	if module.IsPseudoVersion(v) && slices.ContainsFunc(bi.Settings, func(s debug.BuildSetting) bool { return s.Key == "vcs.revision" }) {
		return "(devel) " + v
	}
	return v
}

const usageText = `ephemera is the Ephemera SDK's command line.

Usage:

	ephemera <command> [arguments]

Commands:

	new      write a new driver module (ephemera new -h)
	version  print the SDK version this command was built from
	help     print this help

Run it at the SDK's version:

	go run github.com/ephemera-csi/ephemera/cmd/ephemera@VERSION new example.com/whoami
`

// run is the command line: it returns the exit code (2: bad usage).
func run(args []string, stdout, stderr io.Writer, version string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		return 0
	case "version":
		fmt.Fprintln(stdout, version)
		return 0
	case "new":
		return runNew(args[1:], stdout, stderr, version)
	}
	fmt.Fprintf(stderr, "ephemera: unknown command %q\n\n%s", args[0], usageText)
	return 2
}

const newUsage = `Usage: ephemera new [flags] MODULE [DIR]

Writes a new Ephemera driver module MODULE (a Go module path, e.g.
example.com/whoami) into DIR (default: the last element of MODULE), which must
not exist or be empty, then runs go mod tidy in it. The module builds, vets and
passes its own test as written (the test mounts: run it as root).

Kinds (-kind):
  content  a tmpfs per volume, filled with files by a content hook (default)
  loop     an ext4 filesystem on a loop device per volume (drivers/loop)
  plugin   a content plugin in its own process (framework/pluginserver),
           run by the scratch driver as a backend (--plugin NAME=SOCKET)

Flags:
`

// runNew is the new command.
func runNew(args []string, stdout, stderr io.Writer, version string) int {
	fs := flag.NewFlagSet("ephemera new", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), newUsage)
		fs.PrintDefaults()
	}
	var c config
	fs.StringVar(&c.Kind, "kind", kindContent, "what the driver is: content, loop or plugin")
	fs.StringVar(&c.DriverName, "driver-name", "", "the CSI driver name (default: MODULE reversed as a domain, e.g. whoami.example.com)")
	fs.StringVar(&c.Name, "name", "", "the binary, image and plugin name (default: MODULE's last element)")
	fs.StringVar(&c.Image, "image", "", "the image repository (default registry.example.com/NAME)")
	fs.StringVar(&c.SDKVersion, "sdk", "", "the SDK version to require (default: the version this command was built from)")
	fs.StringVar(&c.Replace, "replace", "", "a checkout of the SDK to build against: writes a replace directive to it")
	tidy := fs.Bool("tidy", true, "run go mod tidy in the new module (fills in go.sum)")
	// Flags may come before and after the positional arguments.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	switch len(pos) {
	case 1:
		c.Module = pos[0]
	case 2:
		c.Module, c.Dir = pos[0], pos[1]
	default:
		if len(pos) == 0 {
			fmt.Fprintln(stderr, "ephemera new: the module path is missing")
		} else {
			fmt.Fprintf(stderr, "ephemera new: too many arguments: %s\n", strings.Join(pos[2:], " "))
		}
		fs.Usage()
		return 2
	}
	if err := c.resolve(version); err != nil {
		fmt.Fprintf(stderr, "ephemera new: %v\n", err)
		return 2
	}
	files, err := c.write()
	if err != nil {
		fmt.Fprintf(stderr, "ephemera new: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "Wrote %s (%s driver %s, module %s, %s):\n", c.Dir, c.Kind, c.DriverName, c.Module, c.sdkSummary())
	for _, f := range files {
		fmt.Fprintf(stdout, "  %s\n", f)
	}
	if *tidy {
		if err := c.tidy(stderr); err != nil {
			fmt.Fprintf(stderr, "ephemera new: %v\nThe files are written; run go mod tidy in %s once that is fixed.\n", err, c.Dir)
			return 1
		}
	}
	fmt.Fprintf(stdout, "\nNext:\n  cd %s\n  sudo make test    # its drivertest test mounts\n  make image        # the image, without a container engine\n  # then deploy/values.yaml with the chart deploy/helm/ephemera-driver (README.md)\n", c.Dir)
	return 0
}
