package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ephemera-csi/ephemera/framework/events/eventstest"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
)

var (
	_ framework.EventSink          = (*Recorder)(nil)
	_ framework.CSIDriverEventSink = (*Recorder)(nil)
	_ framework.Runnable           = (*Recorder)(nil)
)

// sink is the events client of a fake clientset.
func sink(c *fake.Clientset) Client { return eventstest.Client{C: c} }

// newRecorder returns a Recorder of opts writing to client (a new fake
// clientset when nil), with DriverName and NodeName set when empty.
func newRecorder(t *testing.T, client *fake.Clientset, opts Options) (*Recorder, *fake.Clientset) {
	t.Helper()
	if client == nil {
		client = fake.NewClientset()
	}
	opts.Client = sink(client)
	if opts.DriverName == "" {
		opts.DriverName = "scratch.csi.ephemera.dev"
	}
	if opts.NodeName == "" {
		opts.NodeName = "node-a"
	}
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r, client
}

// start runs r until the returned stop is called (or the test ends); stop
// returns Run's error.
func start(t *testing.T, r *Recorder) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// waitFor lists the events in ns until one has reason, and returns them all.
// The broadcaster writes in order, so everything sent before is handled.
func waitFor(t *testing.T, client *fake.Clientset, ns, reason string) []corev1.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Items {
			if e.Reason == reason {
				return l.Items
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event in %s", reason, ns)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An event about the CSIDriver object, which is cluster-scoped, lands in the
// "default" namespace with the object as its involvedObject.
func TestCSIDriverEvent(t *testing.T) {
	r, client := newRecorder(t, nil, Options{})
	r.CSIDriverEvent(api.CSIDriver{Name: "scratch.csi.ephemera.dev", UID: "uid-9"}, corev1.EventTypeWarning, framework.ReasonCSIDriverMisconfigured, "spec.podInfoOnMount must be true")
	start(t, r) // sent before Run: kept for it
	evs := waitFor(t, client, "default", framework.ReasonCSIDriverMisconfigured)
	want := corev1.ObjectReference{APIVersion: "storage.k8s.io/v1", Kind: "CSIDriver", Name: "scratch.csi.ephemera.dev", UID: "uid-9"}
	if len(evs) != 1 || evs[0].InvolvedObject != want || evs[0].Type != corev1.EventTypeWarning || evs[0].Message != "spec.podInfoOnMount must be true" {
		t.Fatalf("events %+v", evs)
	}
}

func TestEventReferencesPod(t *testing.T) {
	r, client := newRecorder(t, nil, Options{DriverName: "scratch.csi.ephemera.dev", NodeName: "node-a"})
	start(t, r)
	pod := api.Pod{Namespace: "team", Name: "web-0", UID: "5d6c0b3e-uid"}
	r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", `volume "scratch": size 8Gi exceeds the maximum 4Gi`)

	evs := waitFor(t, client, "team", "ProvisioningFailed")
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	e := evs[0]
	want := corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "team", Name: "web-0", UID: "5d6c0b3e-uid"}
	if e.InvolvedObject != want {
		t.Errorf("involvedObject %+v, want %+v", e.InvolvedObject, want)
	}
	if e.Type != corev1.EventTypeWarning || e.Message != `volume "scratch": size 8Gi exceeds the maximum 4Gi` || e.Count != 1 {
		t.Errorf("event %s %q count %d", e.Type, e.Message, e.Count)
	}
	if e.Source.Component != "scratch.csi.ephemera.dev" || e.Source.Host != "node-a" || e.ReportingController != "scratch.csi.ephemera.dev" {
		t.Errorf("source %+v, reportingController %q", e.Source, e.ReportingController)
	}
}

// Events about one pod are limited per minute whatever their reason or type;
// other pods have their own budget; the budget refills with time.
func TestRateLimitPerPod(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	r, client := newRecorder(t, nil, Options{DriverName: "d", NodeName: "n", PerPodPerMinute: 3, clock: clk})
	start(t, r)
	noisy := api.Pod{Namespace: "ns", Name: "noisy", UID: "u1"}
	quiet := api.Pod{Namespace: "ns", Name: "quiet", UID: "u2"}
	for i := range 50 {
		reason := "ProvisioningFailed"
		if i%2 == 1 {
			reason = "RefreshFailed"
		}
		r.Event(noisy, corev1.EventTypeWarning, reason, fmt.Sprintf("attempt %d failed", i))
	}
	r.Event(quiet, corev1.EventTypeNormal, "OrphanRemoved", "removed")
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel1", "")

	waitFor(t, client, "ns", "Sentinel1")
	if got := writes(client, "noisy"); got != 3 {
		t.Errorf("noisy pod: %d event writes for 50 events, want the burst of 3", got)
	}
	if got := writes(client, "quiet"); got != 1 {
		t.Errorf("quiet pod: %d event writes, want 1 (own budget)", got)
	}

	// A minute later the noisy pod has a budget of 3 again.
	clk.Step(time.Minute)
	for i := range 10 {
		r.Event(noisy, corev1.EventTypeWarning, "ProvisioningFailed", fmt.Sprintf("later attempt %d", i))
	}
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel2", "")
	waitFor(t, client, "ns", "Sentinel2")
	if got := writes(client, "noisy"); got != 6 {
		t.Errorf("noisy pod after a minute: %d event writes in all, want 6", got)
	}
}

// writes counts the events about pod that the recorder sent: creates, and
// patches (count and message) of events it created. A patch of an event that
// was never created (its first occurrence was rate limited) fails and is
// followed by a create of the same event; that pair is one event.
func writes(client *fake.Clientset, pod string) int {
	n := 0
	created := map[string]bool{}
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "events" {
			continue
		}
		switch a := a.(type) {
		case k8stesting.CreateAction:
			e := a.GetObject().(*corev1.Event)
			created[e.Name] = true
			if e.InvolvedObject.Name == pod {
				n++
			}
		case k8stesting.PatchAction:
			if name, _, _ := strings.Cut(a.GetName(), "."); name == pod && created[a.GetName()] {
				n++
			}
		}
	}
	return n
}

// The default rate limit is DefaultPerPodPerMinute.
func TestRateLimitDefault(t *testing.T) {
	r, client := newRecorder(t, nil, Options{clock: clocktesting.NewFakeClock(time.Now())})
	start(t, r)
	pod := api.Pod{Namespace: "ns", Name: "noisy", UID: "u1"}
	for i := range 20 {
		r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", fmt.Sprintf("attempt %d failed", i))
	}
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel", "")
	waitFor(t, client, "ns", "Sentinel")
	if got := writes(client, "noisy"); got != DefaultPerPodPerMinute {
		t.Errorf("%d event writes for 20 events, want the default burst of %d", got, DefaultPerPodPerMinute)
	}
}

func TestNewValidates(t *testing.T) {
	client := fake.NewClientset()
	for _, c := range []struct {
		name string
		opts Options
		want []string // "" for no error
	}{
		{name: "complete", opts: Options{Client: sink(client), DriverName: "d", NodeName: "n"}},
		{name: "empty", opts: Options{}, want: []string{"Client is required", "DriverName is required", "NodeName is required"}},
		{name: "no client", opts: Options{DriverName: "d", NodeName: "n"}, want: []string{"Client is required"}},
		{name: "negative rate", opts: Options{Client: sink(client), DriverName: "d", NodeName: "n", PerPodPerMinute: -1},
			want: []string{"PerPodPerMinute -1 must not be negative"}},
		{name: "negative node rate", opts: Options{Client: sink(client), DriverName: "d", NodeName: "n", PerNodePerMinute: -2},
			want: []string{"PerNodePerMinute -2 must not be negative"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(c.opts)
			if c.want == nil {
				if err != nil || r == nil {
					t.Fatalf("New: %v, %v", r, err)
				}
				return
			}
			if err == nil || r != nil {
				t.Fatalf("New: %v, %v, want an error", r, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New: %v, want it to say %q", err, w)
				}
			}
		})
	}
}

// New starts nothing and writes nothing; events sent before Run are kept and
// written once it runs.
func TestEventBeforeRunIsKept(t *testing.T) {
	r, client := newRecorder(t, nil, Options{})
	pod := api.Pod{Namespace: "ns", Name: "early", UID: "u1"}
	r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", "before Run")
	time.Sleep(50 * time.Millisecond)
	if n := len(client.Actions()); n != 0 {
		t.Fatalf("%d API calls before Run, want none", n)
	}
	start(t, r)
	evs := waitFor(t, client, "ns", "ProvisioningFailed")
	if len(evs) != 1 || evs[0].Message != "before Run" {
		t.Errorf("events %+v, want the one sent before Run", evs)
	}
}

// Before Run, at most maxPending events are kept; Event never blocks.
func TestEventsBeforeRunAreBounded(t *testing.T) {
	r, _ := newRecorder(t, nil, Options{})
	for i := range maxPending + 10 {
		r.Event(api.Pod{Namespace: "ns", Name: fmt.Sprint("p", i), UID: "u"}, corev1.EventTypeNormal, "R", "")
	}
	r.mu.Lock()
	n := len(r.pending)
	r.mu.Unlock()
	if n != maxPending {
		t.Errorf("%d events kept before Run, want %d", n, maxPending)
	}
}

// Run writes the events sent before its context ended before it returns;
// events after it returned are dropped without blocking or panicking; a
// Recorder runs once.
func TestRunFlushesThenDrops(t *testing.T) {
	// A slow API server: each write takes 100ms, so the events are still
	// queued when the context ends.
	client := fake.NewClientset()
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		time.Sleep(100 * time.Millisecond)
		return false, nil, nil
	})
	r, _ := newRecorder(t, client, Options{})
	stop := start(t, r)
	pod := api.Pod{Namespace: "ns", Name: "last", UID: "u1"}
	r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", "just before the end")
	r.Event(pod, corev1.EventTypeWarning, "RefreshFailed", "also before the end")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v, want nil when its context ends", err)
	}
	if got := writes(client, "last"); got != 2 {
		t.Errorf("%d writes of the 2 events sent before the end, want 2 by the time Run returned", got)
	}
	if got := writes(client, "flush"); got != 0 || len(client.Actions()) != 2 {
		t.Errorf("API calls %v, want only the pod's events (the flush marker is not written)", client.Actions())
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", "after the end")
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Event after Run returned blocks")
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(client.Actions()); n != 2 {
		t.Errorf("%d API calls, want no write after Run returned", n)
	}
	if err := r.Run(t.Context()); err == nil {
		t.Error("a second Run returned nil, want an error")
	}
}

// When the API server is unreachable, Run gives up on the queued events after
// the flush timeout instead of hanging the driver's shutdown.
func TestRunFlushTimeout(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	r, _ := newRecorder(t, client, Options{flushTimeout: 200 * time.Millisecond})
	stop := start(t, r)
	r.Event(api.Pod{Namespace: "ns", Name: "p", UID: "u"}, corev1.EventTypeWarning, "ProvisioningFailed", "unwritable")
	// Wait for the first attempt: the broadcaster then sleeps before a retry.
	deadline := time.Now().Add(10 * time.Second)
	for len(client.Actions()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the event was never attempted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	begin := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Run took %s to return after its context ended, want about the flush timeout", d)
	}
}

func TestTruncate(t *testing.T) {
	long := strings.Repeat("é", 600) // 1200 bytes
	got := truncate(long, maxMessage)
	if len(got) > maxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Errorf("truncate: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if truncate("short", maxMessage) != "short" {
		t.Error("short message changed")
	}
}

// An event identical to one written in the last 10 minutes is merged into it:
// one Event with a count, as kubectl shows repeats. After the window, or with
// another message, it is a new Event.
func TestRepeatsAreCounted(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	r, client := newRecorder(t, nil, Options{PerPodPerMinute: 100, clock: clk})
	start(t, r)
	pod := api.Pod{Namespace: "ns", Name: "web", UID: "u1"}
	for range 3 {
		r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", "size too large")
	}
	r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", "another message")
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel1", "")
	evs := waitFor(t, client, "ns", "Sentinel1")
	counts := map[string]int32{}
	for _, e := range evs {
		counts[e.Message] += e.Count
		if e.Message == "size too large" && e.Count != 3 {
			t.Errorf("repeated event has count %d in one Event, want 3", e.Count)
		}
	}
	if len(evs) != 3 || counts["size too large"] != 3 || counts["another message"] != 1 {
		t.Errorf("events %+v, want 3 Events (the repeats merged)", evs)
	}

	clk.Step(11 * time.Minute)
	r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", "size too large")
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel2", "")
	evs = waitFor(t, client, "ns", "Sentinel2")
	n := 0
	for _, e := range evs {
		if e.Message == "size too large" {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d Events with the repeated message after the window, want a new one (2)", n)
	}
}

// All events of the node together are limited per minute: many pods, each
// within its own budget, get PerNodePerMinute writes in all; the budget
// refills with time.
func TestRateLimitPerNode(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	r, client := newRecorder(t, nil, Options{PerPodPerMinute: 5, PerNodePerMinute: 4, clock: clk})
	start(t, r)
	for i := range 20 {
		r.Event(api.Pod{Namespace: "ns", Name: fmt.Sprint("p", i), UID: fmt.Sprint("u", i)}, corev1.EventTypeWarning, "RefreshFailed", "backend down")
	}
	time.Sleep(100 * time.Millisecond) // nothing to wait for: the dropped events leave no trace
	waitWrites := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			n := 0
			for _, a := range client.Actions() {
				if a.GetVerb() == "create" || a.GetVerb() == "patch" {
					n++
				}
			}
			if n == want {
				return
			}
			if n > want || time.Now().After(deadline) {
				t.Fatalf("%d event writes, want %d", n, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitWrites(4)
	clk.Step(30 * time.Second) // half a minute: 2 tokens
	for i := range 5 {
		r.Event(api.Pod{Namespace: "ns", Name: fmt.Sprint("q", i), UID: fmt.Sprint("v", i)}, corev1.EventTypeWarning, "RefreshFailed", "backend down")
	}
	waitWrites(6)
	time.Sleep(100 * time.Millisecond)
	waitWrites(6)
}

// Messages that differ only in their numbers are repeats: merged into one
// Event whose message is the latest.
func TestRepeatsWithNumbersAggregate(t *testing.T) {
	r, client := newRecorder(t, nil, Options{PerPodPerMinute: 100, PerNodePerMinute: 100, clock: clocktesting.NewFakeClock(time.Now())})
	start(t, r)
	pod := api.Pod{Namespace: "ns", Name: "web", UID: "u1"}
	for i := range 4 {
		r.Event(pod, corev1.EventTypeWarning, "RefreshFailed", fmt.Sprintf("content of 1,%03d.5 MiB over the budget of %d MiB after %dms", i*7, 16+i, 100*i))
	}
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel", "")
	evs := waitFor(t, client, "ns", "Sentinel")
	var got []corev1.Event
	for _, e := range evs {
		if e.Reason == "RefreshFailed" {
			got = append(got, e)
		}
	}
	if len(got) != 1 || got[0].Count != 4 || got[0].Message != "content of 1,021.5 MiB over the budget of 19 MiB after 300ms" {
		t.Fatalf("events %+v, want one with count 4 and the last message", got)
	}
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"":                          "",
		"no numbers":                "no numbers",
		"3 of 10 MiB in use":        "# of # MiB in use",
		"1,024.5 bytes, then 7.":    "# bytes, then #.",
		`volume "v2": size 8Gi`:     `volume "v#": size #Gi`,
		"uid 5d6c0b3e-0001 removed": "uid #d#c#b#e-# removed",
	} {
		if got := normalize(in); got != want {
			t.Errorf("normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

// Retries are jittered (the nodes of a fleet do not retry in step) and wait
// at least as long as the API server asks.
func TestRetryWait(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 50 {
		d := retryWait(errors.New("connection refused"))
		if d < retryDelay/2 || d > retryDelay*3/2 {
			t.Fatalf("retryWait %s, want within [%s, %s]", d, retryDelay/2, retryDelay*3/2)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Errorf("%d distinct waits in 50, want jitter", len(seen))
	}
	busy := apierrors.NewTooManyRequests("slow down", 7)
	if d := retryWait(busy); d != 7*time.Second {
		t.Errorf("retryWait after a 429 with Retry-After 7: %s, want 7s", d)
	}
}

// Issue 44, finding 4: the node's budget is shared between pods. Two pods
// whose refreshes keep failing (an event every 3 s each, for 10 minutes) do
// not spend it for the others: every quiet pod's single event is written,
// the noisy pods still get theirs at the node's other half, and the node
// writes no more than PerNodePerMinute per minute after its burst. On ac28008
// the two noisy pods took all 10 per minute and every quiet pod's event was
// dropped.
func TestNoisyPodsLeaveTheNodesReserve(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	r, client := newRecorder(t, nil, Options{clock: clk}) // the defaults: 5 per pod, 10 per node
	ctx := t.Context()
	noisy := []api.Pod{{Namespace: "ns", Name: "noisy-a", UID: "a"}, {Namespace: "ns", Name: "noisy-b", UID: "b"}}
	const (
		step    = 3 * time.Second
		minutes = 10
	)
	var quiet []string
	for i := range minutes * int(time.Minute/step) {
		for _, pod := range noisy {
			r.write(ctx, podEvent(pod, corev1.EventTypeWarning, "RefreshFailed", fmt.Sprintf("refresh %d failed", i)))
		}
		if i%10 == 5 { // a quiet pod's one event every 30 s, amid the noise
			pod := api.Pod{Namespace: "ns", Name: fmt.Sprint("quiet-", i), UID: fmt.Sprint("q", i)}
			quiet = append(quiet, pod.Name)
			reason := "RefreshFailed"
			if i%20 == 5 {
				reason = "ProvisioningSlow"
			}
			r.write(ctx, podEvent(pod, corev1.EventTypeNormal, reason, "once"))
		}
		clk.Step(step)
	}
	for _, name := range quiet {
		if n := writes(client, name); n != 1 {
			t.Errorf("quiet pod %s: %d event writes, want its one event written", name, n)
		}
	}
	total := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "create" || a.GetVerb() == "patch" {
			total++
		}
	}
	if limit := DefaultPerNodePerMinute * (1 + minutes); total > limit {
		t.Errorf("%d event writes in %d minutes, more than the node's burst and rate allow (%d)", total, minutes, limit)
	}
	for _, pod := range noisy {
		if n := writes(client, pod.Name); n < minutes {
			t.Errorf("noisy pod %s: %d event writes in %d minutes, want at least one a minute (the node's other half is theirs)", pod.Name, n, minutes)
		}
	}
	t.Logf("%d writes: noisy %d and %d, quiet %d", total, writes(client, noisy[0].Name), writes(client, noisy[1].Name), len(quiet))
}
