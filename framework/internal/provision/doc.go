// Package provision runs the creates that may outlive the call that started
// them (a backend that is a framework.LongProvisioner). Its core types are
// Provisions, the lifecycle's long provisioning (start a volume's Create in
// the background, attach a retry to it, cancel it for a teardown), and the
// Registry under it. Each create runs on a goroutine of its own, under a
// context detached from the call's and bounded by its own timeout, and stays
// in the Registry until a later call takes its result (Take) or cancels it
// and waits for it to return (Cancel).
//
// A Registry holds nothing of the node's bulkheads: it only caps the creates
// running per party (a backend), so that one backend's slow creates cannot
// grow without bound. Who holds the volume's lock, its record and its
// capacity is the caller's business.
//
// Provisions reports a slow Create through the func it is made with, so it
// cannot fire the lifecycle's events itself (TestLayers: it cannot import
// internal/lifecycle).
package provision
