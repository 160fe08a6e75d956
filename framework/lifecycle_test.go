package framework_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// publishFake sends the kubelet's request for pod/vol after creating the
// target's parent in the fake, as the kubelet does on disk.
func publishFake(t *testing.T, h *drivertest.Harness, fake *mount.Fake, pod *drivertest.Pod, vol drivertest.InlineVolume) error {
	t.Helper()
	fake.AddDir(filepath.Dir(h.Kubelet.TargetPath(pod, vol.Name)))
	_, err := h.Node.NodePublishVolume(t.Context(), h.Kubelet.PublishRequest(pod, vol))
	return err
}

func dirVolume(name string) drivertest.InlineVolume {
	return drivertest.InlineVolume{Name: name, Attributes: map[string]string{"backend": "dir"}}
}

func TestFailedFirstPublishRollsBack(t *testing.T) {
	h, fake, st := fakeHarness(t, nil)
	pod := h.Kubelet.NewPod("ns", "p")
	fake.Fail(mount.MethodMount, func(string) error { return errors.New("mount: no such device") })

	err := publishFake(t, h, fake, pod, dirVolume("v"))
	if status.Code(err) != codes.Internal {
		t.Fatalf("code %v, want Internal (final) for an unexpected mount error: %v", status.Code(err), err)
	}
	target := h.Kubelet.TargetPath(pod, "v")
	if fake.DirExists(target) {
		t.Error("target directory left after rollback")
	}
	if recs, _ := st.List(t.Context()); len(recs) != 0 {
		t.Errorf("record left after rollback: %+v", recs[0])
	}
	if ids, _ := h.Options.Backends["dir"].(framework.Lister).List(t.Context()); len(ids) != 0 {
		t.Errorf("backend storage left after rollback: %v", ids)
	}
	// The kubelet may retry the same publish: it now succeeds.
	fake.Fail(mount.MethodMount, nil)
	if err := publishFake(t, h, fake, pod, dirVolume("v")); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if fake.MountCount(target) != 1 {
		t.Fatalf("mount count %d", fake.MountCount(target))
	}
}

func TestFailedRollbackKeepsRecordAndIsTransient(t *testing.T) {
	h, fake, st := fakeHarness(t, nil)
	pod := h.Kubelet.NewPod("ns", "p")
	fake.Fail(mount.MethodSetReadOnly, func(string) error { return errors.New("remount failed") })
	fake.Fail(mount.MethodUnmount, func(string) error { return errors.New("device busy") })
	vol := dirVolume("v")
	vol.ReadOnly = true
	err := publishFake(t, h, fake, pod, vol)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("code %v, want Unavailable so the kubelet calls NodeUnpublish later: %v", status.Code(err), err)
	}
	recs, _ := st.List(t.Context())
	if len(recs) != 1 || recs[0].Phase != store.PhasePublishing {
		t.Fatalf("want the Publishing record kept for cleanup, got %+v", recs)
	}
	// The kubelet's later NodeUnpublish cleans up once unmount works again.
	fake.Fail(mount.MethodUnmount, nil)
	target := h.Kubelet.TargetPath(pod, "v")
	if _, err := h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, "v"), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if recs, _ := st.List(t.Context()); len(recs) != 0 || fake.MountCount(target) != 0 || fake.DirExists(target) {
		t.Fatalf("not cleaned: records %d mounts %d dir %v", len(recs), fake.MountCount(target), fake.DirExists(target))
	}
}

// blockMount makes the fake's Mount wait until release is closed.
func blockMount(fake *mount.Fake) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}, 16), make(chan struct{})
	fake.Fail(mount.MethodMount, func(string) error {
		in <- struct{}{}
		<-out
		return nil
	})
	return in, func() { close(out) }
}

func TestConcurrentSameVolumeAborted(t *testing.T) {
	h, fake, _ := fakeHarness(t, nil)
	pod := h.Kubelet.NewPod("ns", "p")
	entered, release := blockMount(fake)
	first := make(chan error, 1)
	go func() { first <- publishFake(t, h, fake, pod, dirVolume("v")) }()
	<-entered
	err := publishFake(t, h, fake, pod, dirVolume("v"))
	if status.Code(err) != codes.Aborted {
		t.Errorf("concurrent publish: %v, want Aborted", err)
	}
	_, err = h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, "v"), TargetPath: h.Kubelet.TargetPath(pod, "v")})
	if status.Code(err) != codes.Aborted {
		t.Errorf("concurrent unpublish: %v, want Aborted", err)
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

func TestInFlightCapResourceExhausted(t *testing.T) {
	h, fake, _ := fakeHarness(t, func(o *framework.Options) { o.Limits.MaxInFlight = 1 })
	a, b := h.Kubelet.NewPod("ns", "a"), h.Kubelet.NewPod("ns", "b")
	entered, release := blockMount(fake)
	first := make(chan error, 1)
	go func() { first <- publishFake(t, h, fake, a, dirVolume("v")) }()
	<-entered
	err := publishFake(t, h, fake, b, dirVolume("v"))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("publish over the in-flight cap: %v, want ResourceExhausted", err)
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := publishFake(t, h, fake, b, dirVolume("v")); err != nil {
		t.Fatalf("after the first finished: %v", err)
	}
}

func TestMaxVolumesPerNode(t *testing.T) {
	h, fake, _ := fakeHarness(t, func(o *framework.Options) { o.Limits.MaxVolumesPerNode = 2 })
	info, err := h.Node.NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{})
	if err != nil || info.MaxVolumesPerNode != 2 || info.NodeId != "node-1" {
		t.Fatalf("NodeGetInfo = %v, %v", info, err)
	}
	pods := []*drivertest.Pod{h.Kubelet.NewPod("ns", "a"), h.Kubelet.NewPod("ns", "b"), h.Kubelet.NewPod("ns", "c")}
	for _, p := range pods[:2] {
		if err := publishFake(t, h, fake, p, dirVolume("v")); err != nil {
			t.Fatal(err)
		}
	}
	// A republish of an existing volume is not a new volume.
	if err := publishFake(t, h, fake, pods[0], dirVolume("v")); err != nil {
		t.Fatalf("republish at the limit: %v", err)
	}
	if err := publishFake(t, h, fake, pods[2], dirVolume("v")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third volume: %v, want ResourceExhausted", err)
	}
	if _, err := h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pods[0].UID, "v"), TargetPath: h.Kubelet.TargetPath(pods[0], "v")}); err != nil {
		t.Fatal(err)
	}
	if err := publishFake(t, h, fake, pods[2], dirVolume("v")); err != nil {
		t.Fatalf("after freeing one: %v", err)
	}
}

func TestReconcileRollsBackInterruptedAndOrphans(t *testing.T) {
	h, fake, st := fakeHarness(t, nil)
	ctx := t.Context()
	dirs := h.Options.Backends["dir"]
	pod := h.Kubelet.NewPod("ns", "p")
	live := h.Kubelet.NewPod("ns", "live")
	if err := publishFake(t, h, fake, live, dirVolume("v")); err != nil {
		t.Fatal(err)
	}
	h.Stop()

	// A publish cut short after the backend created storage and the mount
	// happened, and storage no record knows about.
	id := api.VolumeHandle(pod.UID, "v")
	target := h.Kubelet.TargetPath(pod, "v")
	rec := &store.Record{VolumeID: id, VolumeName: "v", TargetPath: target, Backend: "dir", Phase: store.PhasePublishing}
	if err := st.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	src, err := dirs.Create(ctx, &api.Volume{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	fake.AddMount(target, src)
	orphan := "csi-" + fmtHex(7)
	if _, err := dirs.Create(ctx, &api.Volume{ID: orphan}); err != nil {
		t.Fatal(err)
	}

	h.RestartDriver()
	if _, err := st.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("interrupted record not rolled back: %v", err)
	}
	if fake.MountCount(target) != 0 || fake.DirExists(target) {
		t.Error("interrupted publish's mount or target left")
	}
	ids, _ := dirs.(framework.Lister).List(ctx)
	if len(ids) != 1 || ids[0] != api.VolumeHandle(live.UID, "v") {
		t.Errorf("backend inventory after reconcile = %v, want only the live volume", ids)
	}
	if fake.MountCount(h.Kubelet.TargetPath(live, "v")) != 1 {
		t.Error("live volume was touched by reconcile")
	}
	resp, err := h.Identity.Probe(ctx, &csi.ProbeRequest{})
	if err != nil || !resp.GetReady().GetValue() {
		t.Fatalf("probe after reconcile: %v %v", resp, err)
	}
}

func fmtHex(n int) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 64)
	for i := range b {
		b[i] = hex[(i*n)%16]
	}
	return string(b)
}

func TestIdentityAndCapabilities(t *testing.T) {
	h, _, _ := fakeHarness(t, func(o *framework.Options) { o.Node.Version = "v1.2.3" })
	info, err := h.Identity.GetPluginInfo(t.Context(), &csi.GetPluginInfoRequest{})
	if err != nil || info.Name != "test.csi.ephemera.dev" || info.VendorVersion != "v1.2.3" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	caps, err := h.Identity.GetPluginCapabilities(t.Context(), &csi.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.Capabilities) != 0 {
		t.Fatalf("a node-only plugin advertises no plugin capabilities: %v %v", caps, err)
	}
	for name, call := range map[string]func() error{
		"stage": func() error { _, err := h.Node.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{}); return err },
		"unstage": func() error {
			_, err := h.Node.NodeUnstageVolume(t.Context(), &csi.NodeUnstageVolumeRequest{})
			return err
		},
		"expand": func() error {
			_, err := h.Node.NodeExpandVolume(t.Context(), &csi.NodeExpandVolumeRequest{})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: %v, want Unimplemented", name, err)
		}
	}
}

func TestOptionsValidation(t *testing.T) {
	ok := framework.Options{DriverName: "a.b", Backends: map[string]framework.Backend{"x": framework.BackendFuncs{}}, Node: framework.NodeOptions{ID: "n"}}
	tests := map[string]func(*framework.Options){
		"no name":              func(o *framework.Options) { o.DriverName = "" },
		"bad name":             func(o *framework.Options) { o.DriverName = "-bad" },
		"no node":              func(o *framework.Options) { o.Node.ID = "" },
		"tcp endpoint":         func(o *framework.Options) { o.Node.Endpoint = "tcp://127.0.0.1:1" },
		"relative state":       func(o *framework.Options) { o.Node.StateDir = "state" },
		"relative root":        func(o *framework.Options) { o.Node.KubeletRootDir = "kubelet" },
		"no backends":          func(o *framework.Options) { o.Backends = nil },
		"nil backend":          func(o *framework.Options) { o.Backends = map[string]framework.Backend{"x": nil} },
		"ambiguous default":    func(o *framework.Options) { o.Backends["y"] = framework.BackendFuncs{} },
		"unknown default":      func(o *framework.Options) { o.Volumes.DefaultBackend = "z" },
		"timeout over kubelet": func(o *framework.Options) { o.Limits.OperationTimeout = 3 * time.Minute },
		"long socket path":     func(o *framework.Options) { o.Node.Endpoint = "unix:///" + string(make([]byte, 120)) },
		"negative size cap":    func(o *framework.Options) { o.Limits.MaxVolumeSize = -2 },
		"negative stats walk":  func(o *framework.Options) { o.Limits.StatsWalk.MaxEntries = -1 },
		"negative stats depth": func(o *framework.Options) { o.Limits.StatsWalk.MaxDepth = -1 },
		"stats walk too long":  func(o *framework.Options) { o.Limits.StatsWalk.Timeout = 2 * time.Minute },
		"share over the total": func(o *framework.Options) { o.Limits.MaxInFlight, o.Limits.MaxInFlightPerBackend = 8, 9 },
		"reserve over share": func(o *framework.Options) {
			o.Limits.MaxInFlightPerBackend, o.Limits.InFlightReservedPerBackend = 4, 5
		},
		"reserves over the total": func(o *framework.Options) {
			o.Backends["y"], o.Volumes.DefaultBackend = framework.BackendFuncs{}, "x"
			o.Limits.MaxInFlight, o.Limits.InFlightReservedPerBackend = 8, 5
		},
		"negative per-pod cap":      func(o *framework.Options) { o.Limits.MaxVolumesPerPod = -2 },
		"negative content capacity": func(o *framework.Options) { o.Volumes.ContentCapacity = -2 },
		"negative stats walks":      func(o *framework.Options) { o.Limits.StatsWalk.MaxConcurrent = -1 },
		"negative linked files":     func(o *framework.Options) { o.Limits.StatsWalk.MaxLinkedFiles = -1 },
		"memory limit all content": func(o *framework.Options) {
			o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return nil, nil })
			o.Limits.MemoryLimit, o.Volumes.ContentCapacity = 96<<20, 80<<20
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			o := ok
			o.Backends = map[string]framework.Backend{"x": framework.BackendFuncs{}}
			mutate(&o)
			if _, err := framework.New(o); err == nil {
				t.Fatal("New accepted invalid options")
			}
		})
	}
	d, err := framework.New(ok)
	if err != nil {
		t.Fatal(err)
	}
	got := d.Options()
	if got.Node.KubeletRootDir != "/var/lib/kubelet" || got.Node.StateDir != "/var/lib/ephemera/a.b" ||
		got.Node.Endpoint != "unix:///var/lib/kubelet/plugins/a.b/csi.sock" || got.Volumes.DefaultBackend != "x" || got.Limits.MaxInFlight != 64 ||
		got.Limits.MaxVolumeSize != framework.DefaultMaxVolumeSize || got.Limits.MaxInFlightPerBackend != 64 ||
		got.Limits.InFlightReservedPerBackend != 4 || got.Limits.MaxVolumesPerPod != 16 ||
		got.Limits.StatsWalk != (framework.StatsWalkLimits{MaxEntries: 1_000_000, MaxDepth: 128, Timeout: 5 * time.Second, MaxConcurrent: 4, MaxLinkedFiles: 1 << 16, CacheTTL: time.Minute}) ||
		got.Volumes.ContentCapacity != framework.DefaultContentCapacity {
		t.Errorf("defaults not applied: %+v", got)
	}
}

func TestSecondDriverOnSameStateFailsFast(t *testing.T) {
	base := t.TempDir()
	dirOpts := func() framework.Options {
		sock, err := os.MkdirTemp("", "eph")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(sock) })
		return framework.Options{
			DriverName: "x.y",
			Backends:   map[string]framework.Backend{"x": framework.BackendFuncs{}},
			Node: framework.NodeOptions{
				ID:             "n",
				StateDir:       filepath.Join(base, "state"),
				KubeletRootDir: filepath.Join(base, "kubelet"),
				Endpoint:       "unix://" + filepath.Join(sock, "s"),
			},
			Volumes: framework.VolumeOptions{Mounter: mount.NewFake()},
			State:   framework.StateOptions{LockTimeout: 200 * time.Millisecond},
		}
	}
	drivertest.Start(t, dirOpts())
	d, err := framework.New(dirOpts())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = d.Run(t.Context())
	if err == nil || !containsAll(err.Error(), "state.db", "another driver process") {
		t.Fatalf("second driver: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("second driver hung for %s", time.Since(start))
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// An operator changing a backend default must not turn the republish of a running
// pod into AlreadyExists: the hash covers what the pod asked for.
func TestRepublishAfterDefaultChange(t *testing.T) {
	h, fake, _ := fakeHarness(t, func(o *framework.Options) {
		o.Backends["tmpfs"] = newTmpfs(t, tmpfs.Options{DefaultSize: 1 << 20})
	})
	pod := h.Kubelet.NewPod("ns", "p")
	vol := drivertest.InlineVolume{Name: "v"}
	if err := publishFake(t, h, fake, pod, vol); err != nil {
		t.Fatal(err)
	}
	h.Stop()
	h.Options.Backends["tmpfs"] = newTmpfs(t, tmpfs.Options{DefaultSize: 2 << 20})
	h.RestartDriver()
	if err := publishFake(t, h, fake, pod, vol); err != nil {
		t.Fatalf("republish after the default size changed: %v", err)
	}
	if fake.MountCount(h.Kubelet.TargetPath(pod, "v")) != 1 {
		t.Fatal("republish remounted")
	}
}

// A backend default above the driver's maximum is refused like an explicit size.
func TestMaxVolumeSizeAppliesAfterDefaults(t *testing.T) {
	h, fake, _ := fakeHarness(t, func(o *framework.Options) {
		o.Backends["tmpfs"] = newTmpfs(t, tmpfs.Options{DefaultSize: 2 << 30})
	})
	pod := h.Kubelet.NewPod("ns", "p")
	err := publishFake(t, h, fake, pod, drivertest.InlineVolume{Name: "v"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "maximum volume size") {
		t.Fatalf("default size over the maximum: %v", err)
	}
}

// opaqueBackend is a dir backend that neither lists nor finds its storage: the
// node cannot show what a crash during a publish left, so the framework must
// write an intent record before creating anything.
type opaqueBackend struct{ d *dir.Backend }

func (o opaqueBackend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	return o.d.Create(ctx, v)
}
func (o opaqueBackend) Delete(ctx context.Context, v *api.Volume) error { return o.d.Delete(ctx, v) }
func (o opaqueBackend) Validate(v *api.Volume) error                    { return o.d.Validate(v) }

// A first publish writes its record before the storage only when the node
// could not show the storage after a crash: the dir backend (Finder and
// Lister) and tmpfs (Finder and MountOnly) do without, a backend that is
// neither gets its Publishing record before Create.
func TestIntentRecordOnlyWhereTheNodeCannotTell(t *testing.T) {
	for _, tc := range []struct {
		name           string
		attrs          map[string]string
		opaque, intent bool
	}{
		{name: "tmpfs", attrs: map[string]string{"backend": "tmpfs", "size": "1Mi"}},
		{name: "dir", attrs: map[string]string{"backend": "dir"}},
		{name: "opaque", attrs: map[string]string{"backend": "dir"}, opaque: true, intent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, fake, st := fakeHarness(t, func(o *framework.Options) {
				if tc.opaque {
					o.Backends["dir"] = opaqueBackend{o.Backends["dir"].(*dir.Backend)}
				}
			})
			var during []*store.Record
			fake.Fail(mount.MethodMount, func(string) error {
				during, _ = st.List(context.Background())
				return nil
			})
			pod := h.Kubelet.NewPod("ns", "p")
			vol := drivertest.InlineVolume{Name: "v", Attributes: tc.attrs}
			if err := publishFake(t, h, fake, pod, vol); err != nil {
				t.Fatal(err)
			}
			intent := len(during) == 1 && during[0].Phase == store.PhasePublishing
			if intent != tc.intent || (!tc.intent && len(during) != 0) {
				t.Errorf("records while mounting: %+v; want an intent record: %v", during, tc.intent)
			}
			if recs, _ := st.List(t.Context()); len(recs) != 1 || recs[0].Phase != store.PhasePublished {
				t.Errorf("records after the publish: %+v, want one Published", recs)
			}
		})
	}
}

// A repair (a Published volume found unmounted) that fails after its mount
// unmounts again: the kubelet's retry must repeat the whole repair, not find
// a mount and answer OK for a volume that never became read-only.
func TestFailedRepairLeavesNoHalfFinishedMount(t *testing.T) {
	h, fake, _ := fakeHarness(t, nil)
	pod := h.Kubelet.NewPod("ns", "p")
	vol := dirVolume("v")
	vol.ReadOnly = true
	if err := publishFake(t, h, fake, pod, vol); err != nil {
		t.Fatal(err)
	}
	target := h.Kubelet.TargetPath(pod, "v")
	if err := fake.Unmount(h.Options.Node.KubeletRootDir, target); err != nil {
		t.Fatal(err)
	}
	fake.Fail(mount.MethodSetReadOnly, func(string) error { return errors.New("remount failed") })
	err := publishFake(t, h, fake, pod, vol)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("code %v, want Unavailable: %v", status.Code(err), err)
	}
	if n := fake.MountCount(target); n != 0 {
		t.Fatalf("%d mounts at the target after a failed repair, want 0", n)
	}
	fake.Fail(mount.MethodSetReadOnly, nil)
	if err := publishFake(t, h, fake, pod, vol); err != nil {
		t.Fatalf("retried repair: %v", err)
	}
	if n := fake.MountCount(target); n != 1 {
		t.Fatalf("%d mounts at the target after the repair, want 1", n)
	}
}

// A pod chooses its volume's size: without a cap set, the default (1Gi)
// applies; NoMaxVolumeSize lifts it.
func TestPodChosenSizeIsCappedByDefault(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int64
		want codes.Code
	}{
		{"default", 0, codes.InvalidArgument},
		{"no cap", framework.NoMaxVolumeSize, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, fake, _ := fakeHarness(t, func(o *framework.Options) { o.Limits.MaxVolumeSize = tc.max })
			pod := h.Kubelet.NewPod("ns", "p")
			err := publishFake(t, h, fake, pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "50Gi"}})
			if status.Code(err) != tc.want {
				t.Fatalf("publish of 50Gi: %v, want %v", err, tc.want)
			}
			const msg = `invalid volume attributes: attribute "size": 50Gi is more than this driver's maximum volume size of 1Gi; ask for at most 1Gi`
			if tc.want != codes.OK && status.Convert(err).Message() != msg {
				t.Errorf("message %q, want %q", status.Convert(err).Message(), msg)
			}
		})
	}
}
