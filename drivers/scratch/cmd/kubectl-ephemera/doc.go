// Command kubectl-ephemera is a kubectl plugin that lists what the Ephemera
// scratch driver holds on the nodes of a cluster, from a workstation:
//
//	kubectl ephemera volumes [--node NODE] [-o table|wide|json]
//	kubectl ephemera version
//	kubectl ephemera help
//
// It finds the driver's pods (label app.kubernetes.io/name=ephemera-scratch in
// kube-system, on NODE when given) and asks each for GET /volumes on its
// metrics port through the API server's pod proxy
// (/api/v1/namespaces/NS/pods/POD:PORT/proxy/volumes), --concurrency pods at
// once (default 32), each within --pod-timeout. The node proxy cannot be used:
// it reaches only the kubelet's ports. The caller needs list on pods
// and get on pods/proxy in the driver's namespace (docs/operations.md, "What a
// node holds"). Install: put the binary on PATH as kubectl-ephemera.
//
// It uses client-go's kubeconfig loading and authenticated HTTP client only,
// and decodes the two responses with encoding/json.
package main
