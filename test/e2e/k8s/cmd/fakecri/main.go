// Command fakecri serves the Kubernetes fake CRI runtime (k8s.io/cri-client/pkg/fake)
// on a unix socket, so a real kubelet can run pods without a container runtime. The
// kubelet still mounts every volume for real; containers are only bookkeeping.
package main

import (
	"flag"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "", "unix:///abs/path.sock to listen on")
	images := flag.String("images", "", "comma-separated image references reported as present")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("--endpoint is required")
	}
	rt := fake.NewFakeRemoteRuntime()
	rt.ImageService.SetFakeImageSize(1 << 20)
	var list []string
	for _, s := range strings.Split(*images, ",") {
		if s = strings.TrimSpace(s); s != "" {
			list = append(list, s)
		}
	}
	rt.ImageService.SetFakeImages(list)
	rt.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	if err := rt.Start(*endpoint); err != nil {
		log.Fatal(err)
	}
	log.Printf("fake CRI serving on %s with images %v", *endpoint, list)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	rt.Stop()
}
