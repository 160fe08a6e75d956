// Command genplugin is a test-only Ephemera plugin that provides content only
// (the driver mounts a tmpfs for each volume and writes the files): every
// Content call, a first publish or a refresh, answers one file, "token", of
// --bytes bytes that no earlier answer had, as a token provider's answer is
// new at each rotation. The e2e scenario TestPodCgroupCharging refreshes such
// volumes while their pods keep every generation open.
//
// The file starts with a line naming the generation (a counter of this
// process's answers), the volume and the pod, then a filler up to --bytes.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

func main() {
	endpoint := flag.String("endpoint", "", "the plugin's socket, unix://PATH")
	size := flag.Int("bytes", 4<<20, "the size of every answer's one file")
	klog.InitFlags(nil)
	flag.Parse()
	var gen atomic.Int64
	content := func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
		head := fmt.Sprintf("generation %d volume %s pod %s/%s\n", gen.Add(1), v.ID, v.Pod.Namespace, v.Pod.Name)
		data := make([]byte, 0, max(*size, len(head)))
		data = append(data, head...)
		data = append(data, bytes.Repeat([]byte{'g'}, max(*size-len(head), 0))...)
		return map[string]api.File{"token": {Data: data}}, nil
	}
	s, err := pluginserver.New(pluginserver.Options{Name: "gen", Version: "e2e", Endpoint: *endpoint, Content: framework.ContentFunc(content)})
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		err = s.Run(klog.NewContext(ctx, klog.Background()))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "genplugin:", err)
		os.Exit(1)
	}
}
