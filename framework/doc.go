// Package framework is the Ephemera SDK for Kubernetes ephemeral inline CSI
// volume drivers: node-only drivers whose volumes the kubelet publishes when a pod
// starts (NodePublishVolume) and unpublishes when it ends (NodeUnpublishVolume).
//
// # Writing a driver
//
// A driver is a set of [Backend]s (what storage backs a volume) and optionally a
// [ContentProvider] (what files a volume holds), passed to [New] in [Options].
// [Driver.Run] serves the CSI Identity and Node services on a unix socket until its
// context ends. A backend may implement optional capabilities, found by type
// assertion ([Lister], [Finder], [MountOnly], [Validator], [HealthChecker],
// [Stamper], ...); [BackendFuncs], [ContentFunc], [AuthorizerFunc] and
// [RunnableFunc] build the small interfaces from functions. An [Authorizer]
// approves a volume before anything is created for it; an [EventSink] and a
// [PodChecker] connect the driver to the API server (packages events and kube);
// [Runnable]s run beside it. The framework owns everything else:
//
//   - the request contract: pod information required (CSIDriver podInfoOnMount),
//     volume handle derived from and checked against the target path and pod UID,
//     target confined to the kubelet's pods directory;
//   - durable state in bbolt: a Published record before any OK, an intent
//     record before the side effects of a backend whose storage the node cannot
//     show (the mount table and a Lister or MountOnly otherwise stand in for
//     it), rollback of a failed first publish, idempotent republish and
//     unpublish;
//   - a reconcile at startup, before serving, that rolls back operations cut short
//     by a crash and deletes backend storage no record refers to;
//   - per-volume locks (Aborted), an in-flight cap (ResourceExhausted) and one
//     mapping of errors to gRPC codes;
//   - optional self-registration with the kubelet (Options.Node.RegisterWithKubelet).
//
// # Testing a driver
//
// Package drivertest runs a driver in-process and drives it with a kubelet
// simulator that sends the kubelet's exact requests.
//
// # Platforms
//
// Linux publishes with the new mount API onto the target resolved beneath the
// kubelet root by descriptor; Windows with directory symlinks (see package
// mount). Everything above the platform seam is the same code.
package framework
