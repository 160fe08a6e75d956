package kube

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

var (
	_ framework.PodChecker = (*Pods)(nil)
	_ framework.Runnable   = (*Pods)(nil)
)

// fakePods is the pods client of a fake clientset, as is: Pods needs no
// IsWatchListSemanticsUnSupported method of its client (the fake's watch
// would never end a streamed initial list), it always lists, then watches.
func fakePods(c *fake.Clientset) PodsClient { return c.CoreV1().Pods(metav1.NamespaceAll) }

// run runs p until the returned stop is called (or the test ends); stop
// returns Run's error, and fails the test if Run does not return promptly.
func run(t *testing.T, p *Pods) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = errors.New("Run did not return within 10s of its context's end")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// eventually polls cond for up to 10 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPodsExists(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: types.UID("uid-1"), Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	client := fake.NewClientset(pod)
	p, err := NewPods(PodsOptions{Client: fakePods(client), NodeName: "node-1", StartJitter: -1})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("NewPods made %d API calls, want none", n)
	}
	if _, err := p.PodExists(t.Context(), "uid-1"); err == nil || p.HasSynced() {
		t.Fatal("PodExists answered before Run")
	}
	stop := run(t, p)
	eventually(t, "the informer syncs", p.HasSynced)
	if ok, err := p.PodExists(t.Context(), "uid-1"); err != nil || !ok {
		t.Fatalf("existing pod: %v %v", ok, err)
	}
	if ok, err := p.PodExists(t.Context(), "uid-2"); err != nil || ok {
		t.Fatalf("unknown pod: %v %v", ok, err)
	}
	// The cache keeps the pod's identity only.
	want := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "uid-1", ResourceVersion: pod.ResourceVersion}}
	if objs := p.informer.GetStore().List(); len(objs) != 1 || !equality.Semantic.DeepEqual(objs[0], &want) {
		t.Errorf("cached %+v, want only %+v", objs, want)
	}
	if err := client.CoreV1().Pods("ns").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deletion is seen", func() bool {
		ok, _ := p.PodExists(t.Context(), "uid-1")
		return !ok
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v, want nil when its context ends", err)
	}
	if err := p.Run(t.Context()); err == nil {
		t.Error("a second Run returned nil, want an error")
	}
}

func TestNewPodsValidates(t *testing.T) {
	client := fake.NewClientset()
	for _, c := range []struct {
		name string
		opts PodsOptions
		want []string // nil for no error
	}{
		{name: "complete", opts: PodsOptions{Client: fakePods(client), NodeName: "n", Resync: time.Minute, SyncTimeout: time.Second}},
		{name: "empty", opts: PodsOptions{}, want: []string{"Client is required", "NodeName is required"}},
		{name: "no node", opts: PodsOptions{Client: fakePods(client)}, want: []string{"NodeName is required"}},
		{name: "negative resync", opts: PodsOptions{Client: fakePods(client), NodeName: "n", Resync: -time.Second}, want: []string{"Resync -1s must not be negative"}},
		{name: "negative timeout", opts: PodsOptions{Client: fakePods(client), NodeName: "n", SyncTimeout: -1}, want: []string{"SyncTimeout -1ns must not be negative"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewPods(c.opts)
			if c.want == nil {
				if err != nil || p == nil {
					t.Fatalf("NewPods: %v, %v", p, err)
				}
				return
			}
			if err == nil || p != nil {
				t.Fatalf("NewPods: %v, %v, want an error", p, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("NewPods: %v, want it to say %q", err, w)
				}
			}
		})
	}
}

// An API server that does not answer is logged after SyncTimeout, not
// returned: Run keeps running, PodExists keeps failing (the GC keeps the
// volumes), and the late sync is logged when it comes.
func TestRunSyncTimeout(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "uid-1"}, Spec: corev1.PodSpec{NodeName: "node-1"}}
	client := fake.NewClientset(pod)
	var down atomic.Bool
	down.Store(true)
	unreachable := errors.New("connection refused")
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return down.Load(), nil, unreachable
	})
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		return down.Load(), nil, unreachable
	})
	var log drivertest.SyncBuffer
	p, err := NewPods(PodsOptions{Client: fakePods(client), NodeName: "node-1", SyncTimeout: 100 * time.Millisecond, StartJitter: -1,
		Logger: textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&log)))})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, p)
	eventually(t, "the sync timeout is logged", func() bool { return strings.Contains(log.String(), "Pod informer not synced") })
	if _, err := p.PodExists(t.Context(), "uid-1"); err == nil {
		t.Fatal("PodExists answered before the informer synced")
	}
	down.Store(false)
	eventually(t, "the late sync is logged", func() bool { return strings.Contains(log.String(), "Pod informer synced") })
	if ok, err := p.PodExists(t.Context(), "uid-1"); err != nil || !ok {
		t.Fatalf("existing pod after the late sync: %v %v", ok, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// Run returns when its context ends, even before the first sync.
func TestRunStopsBeforeSync(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	p, err := NewPods(PodsOptions{Client: fakePods(client), NodeName: "node-1", StartJitter: -1})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, p)
	eventually(t, "a list is attempted", func() bool { return len(client.Actions()) > 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// The informer lists the node's pods (the API server's indexed path), then
// watches from the list's resource version: it never asks for a streamed
// initial list (sendInitialEvents), whose cost grows with the cluster.
func TestPodsListThenWatch(t *testing.T) {
	client := fake.NewClientset()
	p, err := NewPods(PodsOptions{Client: fakePods(client), NodeName: "node-1", StartJitter: -1})
	if err != nil {
		t.Fatal(err)
	}
	run(t, p)
	eventually(t, "the informer syncs", p.HasSynced)
	eventually(t, "the watch starts", func() bool {
		for _, a := range client.Actions() {
			if a.GetVerb() == "watch" {
				return true
			}
		}
		return false
	})
	var verbs []string
	for _, a := range client.Actions() {
		verbs = append(verbs, a.GetVerb())
		var fs string
		switch a := a.(type) {
		case k8stesting.ListAction:
			fs = a.GetListRestrictions().Fields.String()
		case k8stesting.WatchAction:
			fs = a.GetWatchRestrictions().Fields.String()
			if rv := a.GetWatchRestrictions().ResourceVersion; rv == "" {
				t.Errorf("watch without a resource version: a streamed initial list")
			}
		}
		if fs != "spec.nodeName=node-1" {
			t.Errorf("%s with field selector %q, want spec.nodeName=node-1", a.GetVerb(), fs)
		}
	}
	if len(verbs) < 2 || verbs[0] != "list" || verbs[1] != "watch" {
		t.Errorf("API calls %q, want a list, then a watch", verbs)
	}
}

// With FleetSize, Run asks the fleet's size once before its first list and
// draws the delay below the fleet's window (50 ms per driver, at least
// StartJitter), from the answer, however long it took (a first start's read
// at its point of FleetSizeReadWindow); an error leaves StartJitter; with no
// jitter it is not asked.
func TestPodsFleetStartJitter(t *testing.T) {
	for _, c := range []struct {
		name   string
		jitter time.Duration
		size   int
		err    error
		want   time.Duration // the longest delay (the window); 0: none
		asked  int32
		spent  time.Duration // how long FleetSize takes to answer
	}{
		{"1,000 drivers", DefaultStartJitter, 1000, nil, 50 * time.Second, 1, 0},
		{"5,000 drivers", DefaultStartJitter, 5000, nil, 250 * time.Second, 1, 0},
		{"an answer that took its time", DefaultStartJitter, 1000, nil, 50 * time.Second, 1, 300 * time.Millisecond},
		{"a small fleet", DefaultStartJitter, 20, nil, DefaultStartJitter, 1, 0},
		{"a longer StartJitter wins", time.Minute, 1000, nil, time.Minute, 1, 0},
		{"unknown", DefaultStartJitter, 0, errors.New("daemonsets.apps is forbidden"), DefaultStartJitter, 1, 0},
		{"no jitter", -1, 1000, nil, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			var window atomic.Int64 // the delays waited, in all
			var asked atomic.Int32
			p, err := NewPods(PodsOptions{Client: fakePods(client), NodeName: "node-1", StartJitter: c.jitter,
				FleetSize: func(ctx context.Context) (int, error) {
					if _, ok := ctx.Deadline(); !ok {
						t.Errorf("FleetSize called without a deadline")
					}
					if window.Load() != int64(c.jitter) {
						t.Errorf("FleetSize asked after %s, want after the delay drawn below StartJitter (%s)", time.Duration(window.Load()), c.jitter)
					}
					asked.Add(1)
					time.Sleep(c.spent)
					return c.size, c.err
				},
				// The longest delay: the whole window is waited.
				delay: func(max time.Duration) time.Duration { return max },
				sleep: func(ctx context.Context, d time.Duration) bool { window.Add(int64(d)); return ctx.Err() == nil }})
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, p)
			eventually(t, "the informer syncs", p.HasSynced)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			// The time FleetSize took is not taken off the rest
			// (spread.Rest): a first start's lists spread over its
			// read's window and the fleet's.
			if got := time.Duration(window.Load()); got != c.want {
				t.Errorf("delays waited in all %s, want %s (the window below which the delay is drawn, whatever the %s the answer took)", got, c.want, c.spent)
			}
			if got := asked.Load(); got != c.asked {
				t.Errorf("FleetSize asked %d times, want %d", got, c.asked)
			}
		})
	}
	if got := FleetStartJitter(600); got != 30*time.Second {
		t.Errorf("FleetStartJitter(600) = %s, want 30s", got)
	}
}

// Run waits the start jitter before its first list, and returns at once when
// its context ends meanwhile; the delay is drawn below StartJitter.
func TestPodsStartJitter(t *testing.T) {
	client := fake.NewClientset()
	var asked atomic.Int64
	p, err := NewPods(PodsOptions{Client: fakePods(client), NodeName: "node-1", StartJitter: time.Hour,
		delay: func(max time.Duration) time.Duration { asked.Store(int64(max)); return max }})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, p)
	eventually(t, "the delay is drawn", func() bool { return asked.Load() != 0 })
	time.Sleep(50 * time.Millisecond)
	if n := len(client.Actions()); n != 0 || p.HasSynced() {
		t.Errorf("%d API calls during the start jitter, want none", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(asked.Load()); got != time.Hour {
		t.Errorf("delay drawn below %s, want below StartJitter (1h)", got)
	}

	// The default draws below DefaultStartJitter.
	q, err := NewPods(PodsOptions{Client: fakePods(client), NodeName: "n"})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if d := q.opts.delay(q.opts.StartJitter); q.opts.StartJitter != DefaultStartJitter || d < 0 || d >= DefaultStartJitter {
			t.Fatalf("default StartJitter %s, delay %s", q.opts.StartJitter, d)
		}
	}
}
