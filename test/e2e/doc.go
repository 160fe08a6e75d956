// Package e2e holds the end-to-end tests of Ephemera's drivers against a real kubelet,
// kube-apiserver and etcd built from the Go module proxy (see README.md). Every file
// except this one needs the build tag e2e, so plain `go test ./...` skips them:
//
//	test/e2e/build-k8s.sh && go test -tags e2e -v -timeout 60m ./test/e2e/...
package e2e
