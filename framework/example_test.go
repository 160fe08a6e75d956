package framework_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
)

// A content driver: each volume is a 1Mi tmpfs holding the pod's name.
func ExampleNew() {
	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := framework.New(framework.Options{
		DriverName: "hello.csi.example.com",
		Backends:   map[string]framework.Backend{"tmpfs": mem},
		Content: framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{"pod-name": {Data: []byte(v.Pod.Name)}}, nil
		}),
		Node: framework.NodeOptions{ID: "node-1"}, // normally os.Getenv("NODE_NAME") from the downward API
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Options().Node.Endpoint)
	// Output: unix:///var/lib/kubelet/plugins/hello.csi.example.com/csi.sock
}

// Run serves until the context ends: stop on SIGTERM like a DaemonSet pod, and
// exit non-zero when Run fails (the kubelet refused the registration, the state
// file is held by another process) so the pod is restarted.
func ExampleDriver_Run() {
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	d, err := framework.New(framework.Options{
		DriverName: "hello.csi.example.com",
		Backends:   map[string]framework.Backend{"tmpfs": mem},
		Node:       framework.NodeOptions{ID: os.Getenv("NODE_NAME")},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// A backend from two functions: a directory per volume.
func ExampleBackendFuncs() {
	root := "/var/lib/example/volumes"
	b := framework.BackendFuncs{
		CreateFunc: func(_ context.Context, v *api.Volume) (api.Source, error) {
			dir := filepath.Join(root, v.ID)
			return api.Source{Path: dir}, os.MkdirAll(dir, 0o755)
		},
		DeleteFunc: func(_ context.Context, v *api.Volume) error {
			return os.RemoveAll(filepath.Join(root, v.ID))
		},
	}
	_ = framework.Options{Backends: map[string]framework.Backend{"dir": b}}
}
