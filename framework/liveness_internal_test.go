package framework

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// wedgingStore is a store whose reads can be made to hang (a wedged disk
// under bbolt) or to fail at once (a store that reports its trouble).
type wedgingStore struct {
	store.Store
	hang    atomic.Bool
	fail    atomic.Bool
	release chan struct{}
}

func (s *wedgingStore) Get(ctx context.Context, id string) (*store.Record, error) {
	if s.fail.Load() {
		return nil, errors.New("disk I/O error")
	}
	if s.hang.Load() {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.Store.Get(ctx, id)
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// /healthz is a CSI Probe through the driver's own socket: a hung state store
// (and so a Probe that never answers) fails it with the reason, and so does a
// store that fails; 200 again once the store answers.
func TestHealthzProbesThroughTheSocket(t *testing.T) {
	st := &wedgingStore{Store: memstore.New(), release: make(chan struct{})}
	d, err := New(Options{
		DriverName:    "live.csi.ephemera.dev",
		Backends:      map[string]Backend{"b": BackendFuncs{}},
		Node:          runNode(t, "ephemera-live"),
		Volumes:       VolumeOptions{Mounter: mount.NewFake()},
		State:         StateOptions{Store: st},
		Observability: ObservabilityOptions{MetricsAddress: "127.0.0.1:0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.health.LivenessTimeout = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	deadline := time.Now().Add(30 * time.Second)
	for !d.Ready() || d.MetricsAddr() == "" {
		if time.Now().After(deadline) {
			t.Fatal("driver not ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	base := "http://" + d.MetricsAddr()

	if code, body := getBody(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz of a serving driver: %d %s", code, body)
	}

	st.hang.Store(true)
	code, body := getBody(t, base+"/healthz")
	// Which deadline fires first is a race: the client's (DeadlineExceeded)
	// or the one the server inherits from it, under which the store check
	// gives up ("context deadline exceeded"). Both name it.
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "CSI Probe over unix://") ||
		!strings.Contains(body, "DeadlineExceeded") && !strings.Contains(body, "deadline exceeded") {
		t.Errorf("/healthz with a hung store: %d %q; want 503 naming the Probe's deadline", code, body)
	}
	st.hang.Store(false)
	close(st.release)

	st.fail.Store(true)
	if code, body := getBody(t, base+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "disk I/O error") {
		t.Errorf("/healthz with a failing store: %d %q; want 503 with the store's error (a restart reopens it)", code, body)
	}
	if code, body := getBody(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "disk I/O error") {
		t.Errorf("/readyz with a store that fails fast: %d %q; want 503 with the store's error", code, body)
	}
	st.fail.Store(false)
	if code, body := getBody(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the store recovered: %d %q", code, body)
	}
}
