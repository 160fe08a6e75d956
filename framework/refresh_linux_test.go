//go:build linux

package framework_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

func tokensJSON(aud, token string) string {
	return `{"` + aud + `":{"token":"` + token + `","expirationTimestamp":"2030-01-01T00:00:00Z"}}`
}

func mountID(t *testing.T, path string) int {
	t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	id := -1
	for _, mi := range infos {
		if mi.MountPoint == path {
			id = mi.ID
		}
	}
	return id
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("reading %s: %v", p, err)
	}
	return string(b)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// A bound on failure, not a wait: a loaded machine (-race, -count, CI
	// beside a build) may take several times longer than an idle one.
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A token-rotating content driver: republish swaps content in place (same mount),
// a failing refresh keeps the old content and is retried, tokens are read from
// secrets (Kubernetes >= 1.35) as well as from volume_context.
func TestRefreshOnRepublish(t *testing.T) {
	var fail atomic.Bool
	var calls atomic.Int64
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			calls.Add(1)
			if fail.Load() {
				return nil, errors.New("vault unavailable")
			}
			return map[string]api.File{
				"token":      {Data: []byte(v.Tokens["vault"].Token), Mode: 0o400},
				"meta/count": {Data: []byte(strconv.FormatInt(calls.Load(), 10))},
			}, nil
		})
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "app")
	vol := drivertest.InlineVolume{Name: "creds", ReadOnly: true, Attributes: map[string]string{"size": "1Mi"}, Tokens: tokensJSON("vault", "T1")}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "creds")
	id := mountID(t, target)
	if got := readFile(t, filepath.Join(target, "token")); got != "T1" {
		t.Fatalf("token = %q", got)
	}

	// requiresRepublish with a rotated token, now in secrets (1.35 layout).
	vol.Tokens, vol.TokensInSecrets = tokensJSON("vault", "T2"), true
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(target, "token")); got != "T2" {
		t.Fatalf("token after republish = %q, want T2", got)
	}
	if mountID(t, target) != id || mountsAt(t, target) != 1 {
		t.Fatalf("republish remounted: id %d -> %d, %d mounts", id, mountID(t, target), mountsAt(t, target))
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("volume writable after refresh: %v", err)
	}

	// The content source fails: the republish answers a retryable error
	// (issue 44: a refused refresh is never silent) and the volume keeps its
	// mount and T2; a retry with backoff picks up T3 once the source is back.
	fail.Store(true)
	vol.Tokens = tokensJSON("vault", "T3")
	if err := k.Publish(ctx, pod, vol); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "vault unavailable") {
		t.Fatalf("republish with a failing refresh: %v, want Unavailable with the cause", err)
	}
	if got := readFile(t, filepath.Join(target, "token")); got != "T2" {
		t.Fatalf("token after failed refresh = %q, want the last good T2", got)
	}
	if mountsAt(t, target) != 1 {
		t.Fatal("failed refresh touched the mount")
	}
	before := calls.Load()
	fail.Store(false)
	waitFor(t, "the retried refresh", func() bool {
		b, _ := os.ReadFile(filepath.Join(target, "token"))
		return string(b) == "T3"
	})
	if calls.Load() <= before {
		t.Fatal("no retry happened")
	}

	// Driver-initiated refresh (a CA rotation, say).
	count := readFile(t, filepath.Join(target, "meta", "count"))
	if err := h.Driver().Refresh(ctx, api.VolumeHandle(pod.UID, "creds")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Refresh", func() bool {
		b, _ := os.ReadFile(filepath.Join(target, "meta", "count"))
		return string(b) != count
	})
	if got := readFile(t, filepath.Join(target, "token")); got != "T3" {
		t.Fatalf("Refresh lost the remembered token: %q", got)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// A first publish whose content fails rolls back completely.
func TestContentFailureOnFirstPublishRollsBack(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return nil, fmt.Errorf("%w: attribute \"role\" is required", api.ErrInvalidParams)
		})
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "p")
	err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "role") {
		t.Fatalf("publish: %v, want InvalidArgument from the content provider", err)
	}
	if n := len(mountUnder(t, h.Options.Node.KubeletRootDir)); n != 0 {
		t.Fatalf("%d mounts left", n)
	}
	if recs := records(t, h); len(recs) != 0 {
		t.Fatalf("records left: %d", len(recs))
	}
}

func TestAuthorizer(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) {
		o.Volumes.Authorizer = framework.AuthorizerFunc(func(_ context.Context, v *api.Volume) error {
			switch v.Pod.Namespace {
			case "team-a":
				return nil
			case "flaky":
				return errors.New("SubjectAccessReview: connection refused")
			}
			return fmt.Errorf("%w: namespace %s is not labelled ephemera.dev/allowed=true", api.ErrPermissionDenied, v.Pod.Namespace)
		})
	})
	k, ctx := h.Kubelet, t.Context()
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}}
	for ns, want := range map[string]codes.Code{"team-a": codes.OK, "team-b": codes.PermissionDenied, "flaky": codes.Unavailable} {
		err := k.Publish(ctx, k.NewPod(ns, "p"), vol)
		if status.Code(err) != want {
			t.Errorf("%s: %v, want %v", ns, err, want)
		}
		if want == codes.PermissionDenied && !strings.Contains(err.Error(), "ephemera.dev/allowed") {
			t.Errorf("refusal does not say what to fix: %v", err)
		}
	}
	if n := len(mountUnder(t, h.Options.Node.KubeletRootDir)); n != 1 {
		t.Fatalf("%d mounts, want only team-a's", n)
	}
}

// RefreshAll over 500 volumes never runs more than RefreshConcurrency content
// calls at once; the test reports the refresh throughput. The pods are
// deleted as the kubelet deletes them: an unpublish that meets a refresh
// still holding the volume (Aborted) is retried.
func TestRefreshAllRateLimit(t *testing.T) {
	const n, limit = 500, 4
	var inflight, peak, calls atomic.Int64
	var refreshing atomic.Bool
	h := realHarness(t, func(o *framework.Options) {
		o.Volumes.RefreshConcurrency = limit
		o.Limits.MaxInFlight = 64
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			if refreshing.Load() {
				cur := inflight.Add(1)
				defer inflight.Add(-1)
				for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
				}
				time.Sleep(time.Millisecond) // a remote call
				calls.Add(1)
			}
			return map[string]api.File{"gen": {Data: []byte(strconv.FormatInt(calls.Load(), 10))}}, nil
		})
	})
	k, ctx := h.Kubelet, t.Context()
	pods := make([]*drivertest.Pod, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range pods {
		pods[i] = k.NewPod("ns", "p"+strconv.Itoa(i))
		wg.Add(1)
		sem <- struct{}{}
		go func(p *drivertest.Pod) {
			defer func() { <-sem; wg.Done() }()
			if err := k.Publish(ctx, p, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "dir"}}); err != nil {
				t.Errorf("publish: %v", err)
			}
		}(pods[i])
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	refreshing.Store(true)
	start := time.Now()
	if err := h.Driver().RefreshAll(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// Done means written, swapped and counted, not only asked for: a refresh
	// whose content call returned still holds its volume until then.
	waitFor(t, "500 refreshes done", func() bool {
		return scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))[`ephemera_refresh_total{result="ok"}`] >= n
	})
	elapsed := time.Since(start)
	refreshing.Store(false)
	if p := peak.Load(); p > limit || p < 2 {
		t.Errorf("peak concurrent content calls %d, want between 2 and %d", p, limit)
	}
	t.Logf("refreshed %d volumes in %v: %.0f refreshes/s with RefreshConcurrency %d (1 ms per content call)", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), limit)
	for _, p := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func(p *drivertest.Pod) {
			defer func() { <-sem; wg.Done() }()
			if err := k.DeletePod(ctx, p); err != nil {
				t.Errorf("delete: %v", err)
			}
		}(p)
	}
	wg.Wait()
}
