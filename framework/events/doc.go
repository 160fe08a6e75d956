// Package events posts the framework's pod events (framework.EventSink) to the
// Kubernetes API as core/v1 Events. Its core type is [Recorder], built by [New]
// from [Options] over a [Client].
//
// The framework itself has no Kubernetes client; a driver that wants events
// builds a Recorder and passes it both as Options.Observability.Events (where events go) and
// among Options.Runnables (so the driver runs it). Its client is kube.Client's
// (which links core/v1 only):
//
//	client, err := kube.NewClient(cfg)
//	if err != nil {
//		return err
//	}
//	rec, err := events.New(events.Options{Client: client.Events(), DriverName: opts.DriverName, NodeName: opts.NodeID})
//	if err != nil {
//		return err
//	}
//	opts.Events = rec
//	opts.Runnables = append(opts.Runnables, rec)
//
// New only checks the options; Run writes events until its context ends, then
// flushes what it can and stops. Without the driver, run it yourself: go
// rec.Run(ctx).
//
// The driver's service account needs create and patch on events (core group).
//
// The Recorder writes events itself, a create and a JSON merge patch of the
// count, rather than through client-go's broadcaster (tools/record), which
// links strategic merge patch, OpenAPI models and YAML parsers for what a node
// plugin's few events need: a larger binary and more of it resident
// (docs/operations.md, "Binary size", has the numbers).
//
// # Rate limiting and aggregation
//
// A pod whose volume keeps failing is retried by the kubelet with backoff, and
// each attempt would be an event. Events about one pod (whatever their type or
// reason) are written at Options.PerPodPerMinute (DefaultPerPodPerMinute) per
// minute after a burst of as many; the rest are dropped. All events of the
// node together are written at Options.PerNodePerMinute
// (DefaultPerNodePerMinute) per minute after a burst of as many: on a fleet
// where every node fails the same way at once (a content backend down), the
// API server gets at most that many writes per node. The node's budget is
// shared between pods as the driver's bulkheads are: half of it (rounded
// down) is a reserve that a noisy pod, one that has spent more than half of
// its own PerPodPerMinute recently, may not take. Pods whose refreshes keep
// failing share the other half, and a quiet pod's RefreshFailed or
// ProvisioningSlow is written even while they fail (with the defaults: 5 of
// the node's 10 per minute are kept for the pods that are not noisy). An
// event like one
// written in the last 10 minutes (same object, type and reason, and the same
// message but for its numbers: "3 of 10 MiB in use" repeats "4 of 10 MiB in
// use") is merged into it: its count, last timestamp and message are patched,
// as kubectl shows them.
//
// A write the API server refuses for now (429, 5xx, a timeout) is retried
// after a jittered delay, or the delay the server asks for (Retry-After) if
// longer: the nodes of a fleet do not retry in step.
//
// # When events are written
//
// Event never blocks and never fails. While Run runs, events are queued and
// written by its goroutine (dropped when the queue of 1000 is full; each write
// is tried three times). Events sent before Run starts are kept, up to 1000,
// and written when it does: the driver starts its runnables only after its
// startup reconcile, and a publish may race with Run's start. Events sent
// after Run returned are dropped (logged at V(4)): nothing would write them.
package events
