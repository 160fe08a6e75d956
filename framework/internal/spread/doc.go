// Package spread sizes the window over which the drivers of a fleet spread
// the start-up work that serves no caller (the orphan GC's first pod list,
// the startup check of the CSIDriver object): Window grows it with the number
// of drivers that may start at once, so that a fleet-wide restart reaches the
// API server at a bounded rate whatever the fleet's size. kube.Pods and the
// framework's startup check use it; publishes never wait for it.
package spread
