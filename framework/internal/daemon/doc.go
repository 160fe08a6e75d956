// Package daemon runs one driver process: framework.Driver.Run's components in
// order — Go's memory limit, the state file (state.go: opened, or recovered
// when damaged), the metrics server, the startup reconcile, the runnables and
// the CSIDriver check, the refresher, the orphan GC, the CSI server, the
// kubelet registrar, the release of the binary's startup pages and readiness —
// and stops them in reverse (components.go). Its core types are Daemon, built
// by package framework from a Config around the lifecycle's Engine and the
// CSI server, and the component; a Config checks itself (config.go:
// Config.Check, which New reports).
package daemon
