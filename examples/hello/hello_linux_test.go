package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// TestHello runs the driver in-process and publishes a volume the way the
// kubelet does, then checks what a container would read.
func TestHello(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts tmpfs: run as root")
	}
	opts, err := Options()
	if err != nil {
		t.Fatal(err)
	}
	h := drivertest.Start(t, opts)
	pod := h.Kubelet.NewPod("shop", "cart-7d9f")
	vol := drivertest.InlineVolume{Name: "whoami", ReadOnly: true}
	if err := h.Kubelet.Publish(t.Context(), pod, vol); err != nil {
		t.Fatalf("publish: %v", err)
	}
	target := h.Kubelet.TargetPath(pod, "whoami")
	t.Cleanup(func() { syscall.Unmount(target, syscall.MNT_DETACH) }) // only if the test failed midway

	for file, want := range map[string]string{"namespace": "shop", "name": "cart-7d9f", "uid": pod.UID, "serviceaccount": "default"} {
		got, err := os.ReadFile(filepath.Join(target, file))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", file, got, err, want)
		}
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err == nil {
		t.Error("readOnly volume is writable")
	}
	// Republish (kubelet restart) is idempotent; deleting the pod cleans up.
	if err := h.Kubelet.Restart(t.Context()); err != nil {
		t.Fatalf("kubelet restart: %v", err)
	}
	if err := h.Kubelet.DeletePod(t.Context(), pod); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target left behind: %v", err)
	}
}
