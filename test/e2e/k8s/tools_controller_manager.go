//go:build tools

package tools

// kube-controller-manager, built by ../build-k8s.sh since the harness runs it for
// the whole suite. Pinned in a file of its own, not in tools.go: tools.go is part
// of the binaries' cache key, and kube-controller-manager's code is fixed by the
// module file's pin alone, which the key covers.
import _ "k8s.io/kubernetes/cmd/kube-controller-manager"
