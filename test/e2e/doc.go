// Package e2e holds the end-to-end tests of Ephemera's drivers against a real kubelet,
// kube-apiserver and etcd built from the Go module proxy (see README.md). Every file
// except this one needs the build tag e2e, so plain `go test ./...` skips them, and
// Linux (the kubelet, containerd, mount tables and cgroups the tests drive), so that
// `GOOS=windows go vet -tags e2e ./test/e2e/` checks this file alone:
//
//	test/e2e/build-k8s.sh && go test -tags e2e -v -timeout 60m ./test/e2e/...
package e2e
