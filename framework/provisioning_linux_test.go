//go:build linux

package framework_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// slowDir is a long provisioning backend: its Create makes the volume's
// directory (the dir backend), then takes delay more, honouring ctx. A
// cancelled Create leaves its directory behind for Delete, the harder case
// for the framework. fail, when set, is what Create returns after delay.
type slowDir struct {
	*dir.Backend
	delay    atomic.Int64
	fail     atomic.Pointer[error]
	creates  atomic.Int32
	returned chan error // every Create's result
}

func (b *slowDir) LongProvisioning() {}

func (b *slowDir) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	b.creates.Add(1)
	src, err := b.createSlowly(ctx, v)
	select {
	case b.returned <- err:
	default:
	}
	return src, err
}

func (b *slowDir) createSlowly(ctx context.Context, v *api.Volume) (api.Source, error) {
	src, err := b.Backend.Create(ctx, v)
	if err != nil {
		return src, err
	}
	t := time.NewTimer(time.Duration(b.delay.Load()))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return api.Source{}, fmt.Errorf("provisioning cut short: %w", ctx.Err())
	}
	if p := b.fail.Load(); p != nil {
		return api.Source{}, *p
	}
	return src, nil
}

// Scaled timeouts: a publish waits for a background Create at most half of
// opTimeout; the simulated kubelet (KubeletBackoff(kubeletScale)) gives each
// call 1.2s and backs off from 5ms.
const (
	opTimeout    = time.Second
	kubeletScale = 1.0 / 100
)

// slowHarness runs a real driver with backends "tmpfs" and "slow" (a slowDir
// whose Create takes delay), content for every volume, and events in ev.
func slowHarness(t *testing.T, delay time.Duration, mutate func(*framework.Options)) (*drivertest.Harness, *slowDir, *sink) {
	t.Helper()
	requireRoot(t)
	base := t.TempDir()
	slow := newSlowDir(t, base, delay)
	ev := &sink{}
	opts := slowOptions(t, base, slow)
	opts.Observability.Events = ev
	opts.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
		return map[string]api.File{"pod": {Data: []byte(v.Pod.Name)}}, nil
	})
	if mutate != nil {
		mutate(&opts)
	}
	t.Cleanup(func() { unmountAll(t, base) })
	h := drivertest.Start(t, opts)
	framework.SetProvisionSlowAfter(h.Driver(), 1200*time.Millisecond) // the kubelet's 2m, scaled
	return h, slow, ev
}

var slowVolume = drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "slow"}}

// slowStorage is the directory of pod's slow volume, as the dir backend makes it.
func slowStorage(h *drivertest.Harness, pod *drivertest.Pod) string {
	return storageIn(h.Options.Node.StateDir, pod)
}

func storageIn(stateDir string, pod *drivertest.Pod) string {
	sum := sha256.Sum256([]byte(pod.UID + slowVolume.Name)) // the kubelet's handle
	return filepath.Join(stateDir, "volumes", "csi-"+hex.EncodeToString(sum[:]))
}

// volumeList is the driver's GET /volumes.
func volumeList(t *testing.T, h *drivertest.Harness) api.VolumeList {
	t.Helper()
	rec := httptest.NewRecorder()
	h.Driver().Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/volumes", nil))
	var list api.VolumeList
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /volumes: %d %v\n%s", rec.Code, err, rec.Body)
	}
	return list
}

func wantStillProvisioning(t *testing.T, err error) {
	t.Helper()
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "still provisioning") {
		t.Fatalf("publish during provisioning: %v, want Aborted, still provisioning", err)
	}
}

// TestLongProvisioningPublishedOnRetry: a Create three times longer than the
// kubelet's call is published by one of the kubelet's retries, which attach
// to it (Create runs once); one ProvisioningSlow event, the metrics count it.
func TestLongProvisioningPublishedOnRetry(t *testing.T) {
	h, slow, ev := slowHarness(t, 3600*time.Millisecond, nil)
	k := h.Kubelet
	pod := k.NewPod("ns", "slowpod")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	attempts, err := drivertest.KubeletBackoff(kubeletScale).Retry(ctx, func(ctx context.Context) error {
		return k.Publish(ctx, pod, slowVolume)
	})
	if err != nil {
		t.Fatalf("publish after %d attempts: %v", len(attempts), err)
	}
	took := time.Since(start)
	if len(attempts) < 2 || took < 3600*time.Millisecond {
		t.Fatalf("published in %d attempts after %s; the Create takes 3.6s", len(attempts), took)
	}
	for _, a := range attempts[:len(attempts)-1] {
		if a.Code != codes.Aborted || !strings.Contains(a.Err.Error(), "still provisioning") || !strings.Contains(a.Err.Error(), " s so far") {
			t.Fatalf("attempt before the publish: %v, want Aborted, still provisioning, N s so far", a.Err)
		}
	}
	if n := slow.creates.Load(); n != 1 {
		t.Fatalf("Create ran %d times, want once: the retries attach to it", n)
	}
	target := k.TargetPath(pod, "v")
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%d mounts at the target, want 1", n)
	}
	if b, err := os.ReadFile(filepath.Join(target, "pod")); err != nil || string(b) != "slowpod" {
		t.Fatalf("content of the published volume: %q, %v", b, err)
	}
	var slowEvents []string
	for _, e := range ev.list() {
		if strings.Contains(e, framework.ReasonProvisioningSlow) {
			slowEvents = append(slowEvents, e)
		}
	}
	if len(slowEvents) != 1 || !strings.HasPrefix(slowEvents[0], "ns/slowpod Normal ProvisioningSlow: Volume v is still being provisioned by backend slow") {
		t.Fatalf("ProvisioningSlow events: %q, want one", slowEvents)
	}
	m := scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))
	if m[`ephemera_provisions_outlived_call_total{backend="slow"}`] != 1 || m[`ephemera_provisioning_volumes{backend="slow"}`] != 0 {
		t.Fatalf("outlived %v, provisioning %v; want 1, 0", m[`ephemera_provisions_outlived_call_total{backend="slow"}`], m[`ephemera_provisioning_volumes{backend="slow"}`])
	}
	recs := records(t, h)
	if len(recs) != 1 || recs[0].Phase != store.PhasePublished || recs[0].Source == nil {
		t.Fatalf("records %+v, want one Published with its source", recs)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(slowStorage(h, pod)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("storage after the pod's deletion: %v", err)
	}
}

// TestLongProvisioningUnpublishCancels: an unpublish while the Create runs
// cancels it, waits for it to return, and deletes what it left: no storage,
// no record, no mount. GET /volumes showed it provisioning before.
func TestLongProvisioningUnpublishCancels(t *testing.T) {
	h, slow, _ := slowHarness(t, time.Hour, nil)
	k := h.Kubelet
	pod := k.NewPod("ns", "p")
	ctx := t.Context()
	wantStillProvisioning(t, k.Publish(ctx, pod, slowVolume))
	if _, err := os.Stat(slowStorage(h, pod)); err != nil {
		t.Fatalf("the Create's storage while it runs: %v", err)
	}
	list := volumeList(t, h)
	if len(list.Volumes) != 1 || list.Volumes[0].Phase != string(store.PhasePublishing) || list.Volumes[0].ProvisioningSince == nil {
		t.Fatalf("GET /volumes during provisioning: %+v, want one Publishing volume with provisioningSince", list.Volumes)
	}
	m := scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))
	if m[`ephemera_provisioning_volumes{backend="slow"}`] != 1 {
		t.Fatalf("ephemera_provisioning_volumes = %v, want 1", m[`ephemera_provisioning_volumes{backend="slow"}`])
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatalf("delete pod during provisioning: %v", err)
	}
	select {
	case err := <-slow.returned:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the Create returned %v, want it cancelled", err)
		}
	default:
		t.Fatal("the unpublish returned before the Create did")
	}
	if _, err := os.Stat(slowStorage(h, pod)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("storage after the unpublish: %v", err)
	}
	if n := mountsAt(t, k.TargetPath(pod, "v")); n != 0 {
		t.Fatalf("%d mounts at the target", n)
	}
	if recs := records(t, h); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

// TestLongProvisioningFailure: a Create that fails after the call ended
// returns its error, with its code, to the retry that attaches; nothing is
// left, and the next retry starts over.
func TestLongProvisioningFailure(t *testing.T) {
	h, slow, _ := slowHarness(t, 1200*time.Millisecond, nil)
	k := h.Kubelet
	pod := k.NewPod("ns", "p")
	ctx := t.Context()
	failure := fmt.Errorf("%w: the template image is gone", api.ErrNotFound)
	slow.fail.Store(&failure)
	wantStillProvisioning(t, k.Publish(ctx, pod, slowVolume))
	var err error
	for err = k.Publish(ctx, pod, slowVolume); status.Code(err) == codes.Aborted; err = k.Publish(ctx, pod, slowVolume) {
	}
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "the template image is gone") {
		t.Fatalf("publish after a failed Create: %v, want its NotFound", err)
	}
	if _, err := os.Stat(slowStorage(h, pod)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("storage after the failure: %v", err)
	}
	slow.fail.Store(nil)
	slow.delay.Store(0)
	if err := k.Publish(ctx, pod, slowVolume); err != nil {
		t.Fatalf("publish after the failure: %v", err)
	}
	if n := slow.creates.Load(); n != 2 {
		t.Fatalf("Create ran %d times, want 2: the retry after the failure starts over", n)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// TestLongProvisioningChangedRequest: another request for the volume while
// its Create runs is refused as any changed request is (AlreadyExists).
func TestLongProvisioningChangedRequest(t *testing.T) {
	h, _, _ := slowHarness(t, time.Hour, nil)
	k := h.Kubelet
	pod := k.NewPod("ns", "p")
	ctx := t.Context()
	wantStillProvisioning(t, k.Publish(ctx, pod, slowVolume))
	changed := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "slow"}, ReadOnly: true}
	if err := k.Publish(ctx, pod, changed); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("changed publish during provisioning: %v, want AlreadyExists", err)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// TestLongProvisioningLanes: Creates running in the background hold no
// publish slot: with the slow backend's whole share provisioning, a tmpfs
// volume is published and unpublished, nothing is in flight, and only a
// further slow volume is refused (its backend's share).
func TestLongProvisioningLanes(t *testing.T) {
	const n = 4
	h, _, _ := slowHarness(t, time.Hour, func(o *framework.Options) {
		o.Limits.MaxInFlight, o.Limits.MaxInFlightPerBackend = n, n
	})
	k := h.Kubelet
	ctx := t.Context()
	pods := make([]*drivertest.Pod, n)
	for i := range pods {
		pods[i] = k.NewPod("ns", fmt.Sprintf("slow-%d", i))
		wantStillProvisioning(t, k.Publish(ctx, pods[i], slowVolume))
	}
	m := scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))
	if m[`ephemera_inflight_operations`] != 0 || m[`ephemera_provisioning_volumes{backend="slow"}`] != n {
		t.Fatalf("in flight %v, provisioning %v; want 0, %d", m[`ephemera_inflight_operations`], m[`ephemera_provisioning_volumes{backend="slow"}`], n)
	}
	other := k.NewPod("ns", "fast")
	if err := k.Publish(ctx, other, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}}); err != nil {
		t.Fatalf("tmpfs publish while %d slow volumes provision: %v", n, err)
	}
	if err := k.DeletePod(ctx, other); err != nil {
		t.Fatalf("tmpfs unpublish while %d slow volumes provision: %v", n, err)
	}
	extra := k.NewPod("ns", "slow-extra")
	if err := k.Publish(ctx, extra, slowVolume); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "provisioning in the background") {
		t.Fatalf("slow publish past its backend's share: %v, want ResourceExhausted", err)
	}
	for _, p := range pods {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if recs := records(t, h); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

// helperEnv makes the test binary a driver with a slow backend whose Create
// never ends (TestLongProvisioningHelper): "base|endpoint".
const helperEnv = "EPHEMERA_TEST_SLOW_DRIVER"

// slowOptions are the options of slowHarness's driver below base, with
// slow as its "slow" backend.
func slowOptions(t *testing.T, base string, slow *slowDir) framework.Options {
	return framework.Options{
		Backends: map[string]framework.Backend{"tmpfs": newTmpfs(t, tmpfs.Options{}), "slow": slow},
		Node:     framework.NodeOptions{KubeletRootDir: filepath.Join(base, "kubelet"), StateDir: filepath.Join(base, "state")},
		Volumes:  framework.VolumeOptions{DefaultBackend: "tmpfs", ContentTimeout: opTimeout / 2},
		Limits:   framework.LimitOptions{OperationTimeout: opTimeout, ProvisionTimeout: 20 * time.Second},
	}
}

func newSlowDir(t *testing.T, base string, delay time.Duration) *slowDir {
	d, err := dir.New(dir.Options{Root: filepath.Join(base, "state", "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	slow := &slowDir{Backend: d, returned: make(chan error, 16)}
	slow.delay.Store(int64(delay))
	return slow
}

// TestLongProvisioningHelper is the driver process TestLongProvisioningKilled
// kills; it runs only under helperEnv.
func TestLongProvisioningHelper(t *testing.T) {
	cfg := os.Getenv(helperEnv)
	if cfg == "" {
		t.Skip("the driver process of TestLongProvisioningKilled")
	}
	base, endpoint, _ := strings.Cut(cfg, "|")
	opts := slowOptions(t, base, newSlowDir(t, base, time.Hour))
	opts.DriverName, opts.Node.ID, opts.Node.Endpoint = "test.csi.ephemera.dev", "node-1", endpoint
	opts.Observability.CSIDriverCheckJitter = -1
	d, err := framework.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	_ = d.Run(context.Background()) // until killed
}

// TestLongProvisioningKilled: a driver killed (SIGKILL) while a Create runs
// in the background leaves nothing once it restarted (the intent record makes
// the startup reconcile delete the half-made storage), and the kubelet's
// retry starts over.
func TestLongProvisioningKilled(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	sockDir, err := os.MkdirTemp("", "slowkill")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	t.Cleanup(func() { unmountAll(t, base) })
	endpoint := "unix://" + filepath.Join(sockDir, "csi.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestLongProvisioningHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+base+"|"+endpoint)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	k := drivertest.NewKubelet(drivertest.KubeletOptions{Root: filepath.Join(base, "kubelet"), Endpoint: endpoint, DriverName: "test.csi.ephemera.dev", NodeName: "node-1", Timeout: 5 * time.Second})
	if err := os.MkdirAll(filepath.Join(base, "kubelet", "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	pod := k.NewPod("ns", "p")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Until the driver serves, the calls fail (no socket, not ready).
	for err = k.Publish(ctx, pod, slowVolume); status.Code(err) != codes.Aborted && ctx.Err() == nil; err = k.Publish(ctx, pod, slowVolume) {
		time.Sleep(20 * time.Millisecond)
	}
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "still provisioning") {
		t.Fatalf("publish: %v, want Aborted, still provisioning\n%s", err, out.String())
	}
	storage := storageIn(filepath.Join(base, "state"), pod)
	if _, err := os.Stat(storage); err != nil {
		t.Fatalf("the Create's storage while it runs: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	killed = true

	slow := newSlowDir(t, base, 0)
	opts := slowOptions(t, base, slow)
	opts.Node.Endpoint = endpoint
	h := drivertest.Start(t, opts)
	if _, err := os.Stat(storage); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("storage after the restart: %v", err)
	}
	if recs := records(t, h); len(recs) != 0 {
		t.Fatalf("records after the restart: %+v", recs)
	}
	if err := k.Publish(ctx, pod, slowVolume); err != nil {
		t.Fatalf("the kubelet's retry after the restart: %v", err)
	}
	if n := slow.creates.Load(); n != 1 {
		t.Fatalf("Create ran %d times after the restart, want once (starting over)", n)
	}
	if n := mountsAt(t, k.TargetPath(pod, "v")); n != 1 {
		t.Fatalf("%d mounts at the target, want 1", n)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// TestLongProvisioningOrphanGC: the pod vanishes from the node while its
// volume's Create runs (no unpublish): the orphan GC cancels the Create and
// removes what it left.
func TestLongProvisioningOrphanGC(t *testing.T) {
	h, slow, _ := slowHarness(t, time.Hour, func(o *framework.Options) {
		o.GC = framework.GCOptions{Interval: 20 * time.Millisecond, OrphanGracePeriod: time.Nanosecond, MaxOrphanShare: 1}
	})
	k := h.Kubelet
	pod := k.NewPod("ns", "p")
	wantStillProvisioning(t, k.Publish(t.Context(), pod, slowVolume))
	if err := k.OrphanPod(pod); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-slow.returned:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the Create returned %v, want it cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the orphan GC did not cancel the Create")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(slowStorage(h, pod))
		if errors.Is(err, os.ErrNotExist) && len(volumeList(t, h).Volumes) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("storage (%v) or records (%+v) left by the orphan GC", err, volumeList(t, h).Volumes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
