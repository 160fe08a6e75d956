package framework_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// BenchmarkPublishUnpublish is the framework's own share of a tmpfs volume's
// publish and unpublish, the kubelet's requests on one connection: the
// interceptor, validation, the volume's lock, the bbolt records (relaxed), the
// logging at --v=2 into a file as shipped, and the metrics, with a
// mounter that only notes what is mounted in place of the kernel (the mounter's share is
// framework/mount's BenchmarkPublishCycle). cpu-ns/op is the CPU time of the
// process (driver and client) per cycle, which moves less with the machine's
// load than the wall time.
func BenchmarkPublishUnpublish(b *testing.B) {
	dir := b.TempDir()
	logAsShipped(b, dir)
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		b.Fatal(err)
	}
	h := drivertest.Start(b, framework.Options{
		Backends:      map[string]framework.Backend{"tmpfs": mem},
		Volumes:       framework.VolumeOptions{Mounter: &nullMounter{}},
		Observability: framework.ObservabilityOptions{Logger: klog.Background()},
	})
	k := h.Kubelet
	vol := drivertest.InlineVolume{Name: "data", Attributes: map[string]string{api.ParamSize: strconv.Itoa(16 << 20)}}
	const pods = 256
	reqs := make([]*csi.NodePublishVolumeRequest, pods)
	for i := range reqs {
		pod := k.NewPod("bench", "pod-"+strconv.Itoa(i))
		reqs[i] = k.PublishRequest(pod, vol)
	}
	ctx := context.Background()
	cpu0 := cpuTime()
	i := 0
	for b.Loop() {
		req := reqs[i%pods]
		i++
		if _, err := h.Node.NodePublishVolume(ctx, req); err != nil {
			b.Fatal(err)
		}
		if _, err := h.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// logAsShipped makes klog write as the shipped driver does (--v=2) into a
// file in dir until the benchmark ends.
func logAsShipped(b *testing.B, dir string) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	f, err := os.Create(filepath.Join(dir, "driver.log"))
	if err != nil {
		b.Fatal(err)
	}
	for name, val := range map[string]string{"v": "2", "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(name, val); err != nil {
			b.Fatal(err)
		}
	}
	klog.SetOutput(f)
	b.Cleanup(func() {
		klog.Flush()
		_ = fs.Set("v", "0")
		_ = fs.Set("logtostderr", "true")
		klog.SetOutput(os.Stderr)
		f.Close()
	})
}

// cpuTime is the CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nullMounter is a mount.Interface that does nothing but note which targets
// are mounted: the framework's cost without the kernel's and without
// mount.Fake's bookkeeping.
type nullMounter struct{ mounted sync.Map }

func (*nullMounter) MakeTarget(string, string) error { return nil }

func (m *nullMounter) Mount(_ string, _ api.Source, target string) error {
	m.mounted.Store(target, true)
	return nil
}

func (*nullMounter) SetReadOnly(string, string, bool) error { return nil }

func (m *nullMounter) Unmount(_, target string) error {
	m.mounted.Delete(target)
	return nil
}

func (m *nullMounter) IsMountPoint(_, target string) (bool, error) {
	_, ok := m.mounted.Load(target)
	return ok, nil
}

func (*nullMounter) Inspect(string, string) (*mount.Mounted, error) { return nil, nil }

func (*nullMounter) RemoveTarget(string, string) error { return nil }

func (*nullMounter) OpenTarget(string, string) (*os.Root, error) { return nil, os.ErrNotExist }

func (*nullMounter) Shows(*mount.Mounted, api.Source) (bool, error) { return false, nil }

func (*nullMounter) MountedAt(api.Source) ([]string, error) { return nil, nil }

func (*nullMounter) Published(string) ([]string, error) { return nil, nil }
