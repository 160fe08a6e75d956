// Command ephemera is the Ephemera SDK's command line. Its one command, new,
// scaffolds a driver module that builds, vets and passes its own test as
// written:
//
//	go run github.com/ephemera-csi/ephemera/cmd/ephemera@VERSION new [flags] MODULE [DIR]
//
// # What new writes
//
// A Go module MODULE in DIR (default: the module path's last element) that
// requires the SDK at the version this command was built from:
//
//   - main.go: the driver (-kind content: a tmpfs filled by a content hook;
//     -kind loop: an ext4 filesystem on a loop device; -kind plugin: a
//     content plugin served over the plugin protocol, which the scratch
//     driver runs as a backend), with framework.BindFlags' flags bound;
//   - a test with framework/drivertest that publishes a volume the way the
//     kubelet does, checks it and unpublishes it (root; skipped otherwise);
//   - deploy/: the CSIDriver (volumeLifecycleModes [Ephemeral],
//     podInfoOnMount), a values file for the chart deploy/helm/ephemera-driver
//     with the driver's name, image and admission label, and a pod;
//   - a Makefile (build, run, test, image, release), a Dockerfile (the
//     alternative to the SDK's daemonless image builder, deploy/images) and a
//     .ci/run script.
//
// The templates are embedded (templates/) and rendered with text/template.
//
// # Versions
//
// Run from a checkout (go run ./cmd/ephemera), the command knows no release
// of the SDK to require: pass -sdk VERSION, or -replace DIR to write a
// replace directive to a checkout (what its tests do).
//
// # Names
//
// The driver name defaults to the module path reversed as a domain
// (example.com/whoami: whoami.example.com) and is checked by
// api.ValidateDriverName, as framework.New checks it; the module path by
// golang.org/x/mod/module.CheckPath.
package main
