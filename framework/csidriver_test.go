package framework_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
)

func ptr[T any](v T) *T { return &v }

// goodCSIDriver is the object the manifests install.
func goodCSIDriver() *api.CSIDriver {
	return &api.CSIDriver{
		Name: "test.csi.ephemera.dev", UID: "uid-1",
		AttachRequired: ptr(false), PodInfoOnMount: ptr(true), VolumeLifecycleModes: []string{"Ephemeral"},
		FSGroupPolicy: ptr("File"), RequiresRepublish: ptr(false),
	}
}

func TestCheckCSIDriver(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*api.CSIDriver)
		want   []string // checks that fail
		says   string   // in the first message
	}{
		{"as installed", func(*api.CSIDriver) {}, nil, ""},
		{"also persistent", func(o *api.CSIDriver) { o.VolumeLifecycleModes = []string{"Persistent", "Ephemeral"} }, nil, ""},
		{"persistent only", func(o *api.CSIDriver) { o.VolumeLifecycleModes = []string{"Persistent"} }, []string{framework.CheckCSIDriverEphemeral}, "[Persistent] must include Ephemeral"},
		{"modes unset", func(o *api.CSIDriver) { o.VolumeLifecycleModes = nil }, []string{framework.CheckCSIDriverEphemeral}, "unset"},
		{"no pod info", func(o *api.CSIDriver) { o.PodInfoOnMount = ptr(false) }, []string{framework.CheckCSIDriverPodInfoOnMount}, "podInfoOnMount must be true"},
		{"pod info unset", func(o *api.CSIDriver) { o.PodInfoOnMount = nil }, []string{framework.CheckCSIDriverPodInfoOnMount}, "podInfoOnMount"},
		{"fsGroupPolicy None", func(o *api.CSIDriver) { o.FSGroupPolicy = ptr("None") }, []string{framework.CheckCSIDriverFSGroupPolicy}, "fsGroupPolicy is None, want File"},
		{"fsGroupPolicy default", func(o *api.CSIDriver) { o.FSGroupPolicy = nil }, []string{framework.CheckCSIDriverFSGroupPolicy}, "ReadWriteOnceWithFSType"},
		{"attach required", func(o *api.CSIDriver) { o.AttachRequired = ptr(true) }, []string{framework.CheckCSIDriverAttachRequired}, "attachRequired must be false"},
		{"all wrong", func(o *api.CSIDriver) { *o = api.CSIDriver{Name: o.Name} }, []string{
			framework.CheckCSIDriverEphemeral, framework.CheckCSIDriverPodInfoOnMount, framework.CheckCSIDriverFSGroupPolicy, framework.CheckCSIDriverAttachRequired}, "Ephemeral"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := goodCSIDriver()
			tc.mutate(o)
			got := framework.CheckCSIDriver(o.Name, o)
			var checks []string
			for _, p := range got {
				checks = append(checks, p.Check)
				if !strings.Contains(p.Message, o.Name) {
					t.Errorf("message does not name the object: %q", p.Message)
				}
			}
			if strings.Join(checks, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("checks %q, want %q (%+v)", checks, tc.want, got)
			}
			if tc.says != "" && !strings.Contains(got[0].Message, tc.says) {
				t.Errorf("message %q does not say %q", got[0].Message, tc.says)
			}
		})
	}
	got := framework.CheckCSIDriver("test.csi.ephemera.dev", nil)
	if len(got) != 1 || got[0].Check != framework.CheckCSIDriverExists || !strings.Contains(got[0].Message, `no CSIDriver object "test.csi.ephemera.dev"`) {
		t.Errorf("missing object: %+v", got)
	}
}

// fakeCSIDrivers answers GetCSIDriver with obj (nil: not found), after
// failing the first fails calls.
type fakeCSIDrivers struct {
	mu    sync.Mutex
	obj   *api.CSIDriver
	fails int
	calls []string
}

func (f *fakeCSIDrivers) GetCSIDriver(_ context.Context, name string) (*api.CSIDriver, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	if len(f.calls) <= f.fails {
		return nil, errors.New("connection refused")
	}
	if f.obj == nil {
		return nil, api.ErrNotFound
	}
	return f.obj, nil
}

// driverEvents records events, about pods and about the CSIDriver object.
type driverEvents struct {
	mu     sync.Mutex
	driver []string
}

func (e *driverEvents) Event(api.Pod, string, string, string) {}

func (e *driverEvents) CSIDriverEvent(obj api.CSIDriver, eventType, reason, message string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.driver = append(e.driver, strings.Join([]string{obj.Name, obj.UID, eventType, reason, message}, "|"))
}

func (e *driverEvents) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.driver...)
}

// At startup the driver checks its CSIDriver object once (retrying a failed
// read), exports the result per check and posts one Warning event on the
// object listing every problem.
func TestCSIDriverCheckedAtStartup(t *testing.T) {
	bad := goodCSIDriver()
	bad.PodInfoOnMount, bad.FSGroupPolicy = ptr(false), ptr("None")
	for _, tc := range []struct {
		name    string
		obj     *api.CSIDriver
		metrics map[string]float64
		event   []string // in the event's message
	}{
		{"fits", goodCSIDriver(), map[string]float64{"exists": 0, "volumeLifecycleModes": 0, "podInfoOnMount": 0, "fsGroupPolicy": 0, "attachRequired": 0}, nil},
		{"misconfigured", bad, map[string]float64{"exists": 0, "volumeLifecycleModes": 0, "podInfoOnMount": 1, "fsGroupPolicy": 1, "attachRequired": 0},
			[]string{"test.csi.ephemera.dev|uid-1|Warning|CSIDriverMisconfigured|", "podInfoOnMount must be true", "; ", "fsGroupPolicy is None"}},
		{"missing", nil, map[string]float64{"exists": 1}, []string{"test.csi.ephemera.dev||Warning|CSIDriverMisconfigured|there is no CSIDriver object"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getter := &fakeCSIDrivers{obj: tc.obj, fails: 1}
			ev := &driverEvents{}
			h, _, _ := fakeHarness(t, func(o *framework.Options) { o.Observability.CSIDrivers = getter; o.Observability.Events = ev })
			// The checks are exported one after another: wait for as many
			// as the case exports (a scrape between two saw only some).
			var got map[string]float64
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				got = map[string]float64{}
				for k, v := range scrape(t, handlerGet(h.Driver().Handler(), "/metrics")) {
					if check, ok := strings.CutPrefix(k, `ephemera_csidriver_misconfigured{check="`); ok {
						got[strings.TrimSuffix(check, `"}`)] = v
					}
				}
				if len(got) >= len(tc.metrics) || time.Now().After(deadline) {
					break
				}
			}
			if len(got) != len(tc.metrics) {
				t.Errorf("metrics %v, want %v", got, tc.metrics)
			}
			for k, v := range tc.metrics {
				if got[k] != v {
					t.Errorf("check %s = %v, want %v", k, got[k], v)
				}
			}
			evs := ev.get()
			if tc.event == nil {
				if len(evs) != 0 {
					t.Errorf("events %q, want none", evs)
				}
			} else if len(evs) != 1 {
				t.Errorf("events %q, want one", evs)
			} else {
				for _, s := range tc.event {
					if !strings.Contains(evs[0], s) {
						t.Errorf("event %q does not contain %q", evs[0], s)
					}
				}
			}
			getter.mu.Lock()
			defer getter.mu.Unlock()
			if len(getter.calls) != 2 || getter.calls[1] != "test.csi.ephemera.dev" {
				t.Errorf("calls %q, want a failed one and a retry", getter.calls)
			}
		})
	}
}

// Without API access nothing is checked and no series is exported.
func TestCSIDriverNotChecked(t *testing.T) {
	h, _, _ := fakeHarness(t, nil)
	for k := range scrape(t, handlerGet(h.Driver().Handler(), "/metrics")) {
		if strings.HasPrefix(k, "ephemera_csidriver_misconfigured") {
			t.Errorf("series %s without API access", k)
		}
	}
}
