// Package fleet is the fleet simulation of make bench-fleet (build tag fleet):
// a real etcd and kube-apiserver (the e2e's build, test/e2e/build-k8s.sh) with
// priority and fairness and RBAC on, the RBAC and FlowSchema of deploy/base,
// pods created through the API by the ReplicaSet controller's service account
// (under priority and fairness) and set running by their node's kubelet
// identity, and N simulated nodes in one process, each with a Node and a pod
// of the driver's DaemonSet, each running the driver's API components
// (framework/kube's pod informer, the CSIDriver read of the startup check, the
// DaemonSet's size, framework/events' Recorder) with a service-account token
// bound to that pod (TokenRequest: the API server's JWT authenticator checks
// it) on a connection of their own, beside a kubelet-like watcher of the
// node's pods (full objects, as the kubelet's) as the baseline.
//
// Phases: steady, churn (a pod lifecycle per node every 10 s), a restart of
// every driver at once (with the informer of main 14ea1a6, which streamed its
// initial list as a watch-list, and with today's list-then-watch; with and
// without the FlowSchema, while a kube-system client measures its latency),
// the API server stopped and resumed, and a burst of failures posting events.
// Each phase is measured from the API server's /metrics (per priority level
// and flow schema too), its priority levels' queues
// (/debug/api_priority_and_fairness/dump_queues, sampled) and /proc; the
// report goes to stdout and EPHEMERA_FLEET_REPORT (the API server's log
// beside it). The kube-system client's slow requests are put against etcd's
// compactions and, when the bench runs with GODEBUG=gctrace=1 (which the API
// server inherits), against the API server's garbage collections: how many
// fell within a collection's mark phase, and what share of the phase the
// marks covered.
//
// docs/operations.md, "At fleet scale", has the numbers and the extrapolation.
package fleet
