// Package lifecycle runs the life of a driver's volumes: the transition table
// and one function per event (lifecycle.go), and the collaborators the events
// call down into — the backends (Backend, storage.go), content (fill.go,
// refresh.go, heldcontent.go), capacity (package internal/capacity), the bulkheads
// (lanes.go over package internal/lanes), the startup reconcile's view of the node (adopt.go), the orphan
// GC (gc.go) and volume stats and health (stats.go). Its core type is Engine,
// built from a Config by package framework, which feeds it the CSI calls.
package lifecycle
