// Package kube connects an Ephemera driver to the Kubernetes API server. It is
// optional: the framework core needs no API access.
//
// Client is a small client of the resources the optional components use, pods
// and events (and the node, its CSINode and the CSIDriver object, for
// StartupTaint and the startup check), built from a rest.Config (a
// kubeconfig's, or the pod's service account's). It links core/v1 only, where
// client-go's typed core/v1 client links every API group of Kubernetes, and the
// clientset more: a much larger driver binary (docs/operations.md, "Binary
// size", has the numbers).
//
// Pods is the orphan GC's confirmation that a pod is gone (framework.PodChecker).
// Like every component of a driver it is built from options by value and run
// by the driver: NewPods checks the options and starts nothing; Run runs the
// informer until its context ends. It goes both in Options.GC.Pods and in
// Options.Runnables:
//
//	client, err := kube.NewClient(cfg)
//	if err != nil {
//		return err
//	}
//	pods, err := kube.NewPods(kube.PodsOptions{Client: client.Pods(), NodeName: opts.NodeID})
//	if err != nil {
//		return err
//	}
//	opts.Pods = pods
//	opts.Runnables = append(opts.Runnables, pods)
//
// Client.Pods lists and watches the pods' metadata only (PartialObjectMetadata):
// no pod spec or status is decoded or kept.
//
// The driver's service account needs list and watch on pods (no get: the
// informer's cache answers every question about a pod).
//
// [StartupTaint], another runnable, lifts the node's startup taint once the
// kubelet has registered the driver; [Client] is its [NodesClient] too.
package kube
