package drivertest_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// fakeOptions are options a driver runs with without root: the fake mounter,
// the in-memory store and a backend that provides nothing.
func fakeOptions() framework.Options {
	return framework.Options{
		Backends: map[string]framework.Backend{"none": framework.BackendFuncs{}},
		Volumes:  framework.VolumeOptions{Mounter: mount.NewFake()},
		State:    framework.StateOptions{Store: memstore.New()},
	}
}

// logTB is the test it wraps, keeping what is logged through Log.
type logTB struct {
	testing.TB
	mu   sync.Mutex
	logs []string
}

func (l *logTB) Log(args ...any) {
	l.TB.Helper()
	l.mu.Lock()
	l.logs = append(l.logs, fmt.Sprint(args...))
	l.mu.Unlock()
	l.TB.Log(args...)
}

func (l *logTB) logged(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.logs {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

func TestStartLogsToTheTest(t *testing.T) {
	tb := &logTB{TB: t}
	drivertest.Start(tb, fakeOptions())
	// Logged before the driver is ready, so before Start returns.
	if !tb.logged("Reconciled state") {
		t.Errorf("the driver's log did not reach t.Log: %q", tb.logs)
	}
}

func TestStartKeepsTheAuthorsLogger(t *testing.T) {
	var buf drivertest.SyncBuffer
	opts := fakeOptions()
	opts.Observability.Logger = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf)))
	tb := &logTB{TB: t}
	drivertest.Start(tb, opts)
	if !strings.Contains(buf.String(), "Reconciled state") {
		t.Errorf("the author's logger got %q", buf.String())
	}
	if tb.logged("Reconciled state") {
		t.Error("the driver logged to t.Log although the author set a Logger")
	}
}

// A driver goroutine that logs after its test ended must not panic the test
// binary (testing.T.Log does, "Log in goroutine after ... has completed").
func TestStartLogAfterTheTestEnded(t *testing.T) {
	var h *drivertest.Harness
	t.Run("driver", func(t *testing.T) {
		h = drivertest.Start(t, fakeOptions())
	})
	h.Options.Observability.Logger.Info("Logged after the test ended")
	h.Options.Observability.Logger.Error(nil, "Logged after the test ended")
}

// With the fake mounter, the Kubelet's directories exist in the Fake too, so
// its whole sequence works without root.
func TestStartFakeMounter(t *testing.T) {
	d, err := dir.New(dir.Options{Root: filepath.Join(t.TempDir(), "dirs")})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	opts := fakeOptions()
	opts.Backends = map[string]framework.Backend{"dir": d, "tmpfs": mem}
	opts.Volumes.DefaultBackend = "dir"
	fake := opts.Volumes.Mounter.(*mount.Fake)
	h := drivertest.Start(t, opts)
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "web")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "data"}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"backend": "tmpfs"}}); err != nil {
		t.Fatalf("publish tmpfs: %v", err)
	}
	target := k.TargetPath(pod, "data")
	if got := fake.MountedTargets(); !slices.Equal(got, []string{target, k.TargetPath(pod, "scratch")}) {
		t.Fatalf("mounted targets in the fake: %q", got)
	}
	if err := k.Restart(ctx); err != nil {
		t.Fatalf("kubelet restart: %v", err)
	}
	h.RestartDriver() // the driver: the in-memory store is the same
	if recs, err := h.Driver().Records(ctx); err != nil || len(recs) != 2 {
		t.Fatalf("records after a driver restart: %d, %v", len(recs), err)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	if fake.DirExists(target) || len(fake.MountedTargets()) > 0 {
		t.Errorf("after DeletePod: target %v, mounts %q", fake.DirExists(target), fake.MountedTargets())
	}
}
