package drivertest_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// testMyDriver is what a driver author writes as TestMyDriver in a _test.go
// file: Start runs the driver in-process, the Kubelet simulator publishes a
// pod's volume with kubelet-exact requests, and the test inspects the target.
// It mounts a real tmpfs, so it needs Linux and root.
func testMyDriver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts tmpfs: run as root")
	}
	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	h := drivertest.Start(t, framework.Options{
		DriverName: "hello.csi.example.com",
		Backends:   map[string]framework.Backend{"tmpfs": mem},
		Content: framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{"pod": {Data: []byte(v.Pod.Name)}}, nil
		}),
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("shop", "cart")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "id", ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(k.TargetPath(pod, "id"), "pod")); err != nil || string(b) != "cart" {
		t.Fatalf("pod = %q, %v", b, err)
	}
	// An unknown attribute is a final InvalidArgument.
	typo := k.NewPod("shop", "typo")
	err = k.Publish(ctx, typo, drivertest.InlineVolume{Name: "id", Attributes: map[string]string{"sise": "1Mi"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish with a typo: %v", err)
	}
	h.RestartDriver() // a driver container restart: state survives
	for _, p := range []*drivertest.Pod{pod, typo} {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// No mount, target, pod directory, record or backend storage is left.
	h.RequireClean(t)
}

// A driver test: see testMyDriver for the body of a TestXxx function.
func ExampleStart() {
	_ = testMyDriver
}

// PublishRequest shows what the kubelet sends for an inline volume, without a
// driver and without root: the volume handle derived from the pod UID and the
// volume name, the pod-info keys added to the attributes, and the tokens of
// CSIDriver.spec.tokenRequests (in secrets with serviceAccountTokenInSecrets).
func ExampleKubelet_PublishRequest() {
	root, err := os.MkdirTemp("", "kubelet")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(root)
	k := drivertest.NewKubelet(drivertest.KubeletOptions{Root: root, DriverName: "tokenfile.csi.example.com"})
	pod := k.NewPod("team-a", "app")
	req := k.PublishRequest(pod, drivertest.InlineVolume{
		Name:            "vault",
		ReadOnly:        true,
		Attributes:      map[string]string{"audience": "vault"},
		Tokens:          `{"vault":{"token":"eyJ...","expirationTimestamp":"2030-01-01T00:00:00Z"}}`,
		TokensInSecrets: true,
	})
	fmt.Println(strings.HasPrefix(req.GetVolumeId(), "csi-"), req.GetVolumeId() == api.VolumeHandle(pod.UID, "vault"))
	fmt.Println(req.GetTargetPath() == k.TargetPath(pod, "vault"), req.GetReadonly())
	for _, key := range slices.Sorted(maps.Keys(req.GetVolumeContext())) {
		fmt.Println("context:", key)
	}
	for _, key := range slices.Sorted(maps.Keys(req.GetSecrets())) {
		fmt.Println("secret:", key)
	}
	// Output:
	// true true
	// true true
	// context: audience
	// context: csi.storage.k8s.io/ephemeral
	// context: csi.storage.k8s.io/pod.name
	// context: csi.storage.k8s.io/pod.namespace
	// context: csi.storage.k8s.io/pod.uid
	// context: csi.storage.k8s.io/serviceAccount.name
	// secret: csi.storage.k8s.io/serviceAccount.tokens
}
