package daemon

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// trace records the start, run-end and stop of components.
type trace struct {
	mu  sync.Mutex
	got []string
}

func (tr *trace) add(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.got = append(tr.got, s)
}

// traced is a component that records its steps; runErr, when set, is what
// its run returns at once; startErr what its start returns.
func (tr *trace) traced(name string, startErr, runErr, stopErr error) component {
	return component{
		name: name,
		start: func(context.Context) error {
			tr.add("start " + name)
			return startErr
		},
		run: func(ctx context.Context) error {
			if runErr != nil {
				tr.add("fail " + name)
				return runErr
			}
			<-ctx.Done()
			tr.add("ended " + name)
			return nil
		},
		stop: func() error {
			tr.add("stop " + name)
			return stopErr
		},
	}
}

func TestRunComponentsOrder(t *testing.T) {
	log := ktesting.NewLogger(t, ktesting.NewConfig())
	boom, late := errors.New("boom"), errors.New("late")
	var tr *trace
	// run runs cs; with cancel, a last component ends ctx once everything
	// has started.
	run := func(cancel bool, cs ...component) error {
		ctx, stop := context.WithCancel(t.Context())
		defer stop()
		if cancel {
			cs = append(cs, component{name: "cancel", run: func(context.Context) error { stop(); return nil }})
		}
		return components{log, cs}.run(ctx)
	}

	// ctx ends: all started in order, stopped in reverse, each run ending
	// before its stop and after the later components stopped.
	tr = &trace{}
	if err := run(true, tr.traced("a", nil, nil, nil), tr.traced("b", nil, nil, nil), tr.traced("c", nil, nil, nil)); err != nil {
		t.Fatal(err)
	}
	want := []string{"start a", "start b", "start c", "ended c", "stop c", "ended b", "stop b", "ended a", "stop a"}
	if !slices.Equal(tr.got, want) {
		t.Errorf("ctx ended: %q, want %q", tr.got, want)
	}

	// A run fails: the rest stop in reverse, its error is returned (not a
	// stop's).
	tr = &trace{}
	err := run(false, tr.traced("a", nil, nil, late), tr.traced("b", nil, boom, nil), tr.traced("c", nil, nil, nil))
	if !errors.Is(err, boom) {
		t.Errorf("run failed: %v, want %v", err, boom)
	}
	if i, j := slices.Index(tr.got, "stop c"), slices.Index(tr.got, "stop a"); i < 0 || j < i || !slices.Contains(tr.got, "stop b") {
		t.Errorf("run failed: %q, want c, b, a stopped in that order", tr.got)
	}

	// A start fails: the later ones never start, the earlier stop in reverse.
	tr = &trace{}
	err = run(false, tr.traced("a", nil, nil, nil), tr.traced("b", nil, nil, nil), tr.traced("c", boom, nil, nil), tr.traced("d", nil, nil, nil))
	want = []string{"start a", "start b", "start c", "ended b", "stop b", "ended a", "stop a"}
	if !errors.Is(err, boom) || !slices.Equal(tr.got, want) {
		t.Errorf("start failed: %v %q, want %v %q", err, tr.got, boom, want)
	}

	// No failure: the first stop error is returned.
	tr = &trace{}
	if err := run(true, tr.traced("a", nil, nil, late), tr.traced("b", nil, nil, boom)); !errors.Is(err, boom) {
		t.Errorf("stop failed: %v, want %v (the first stop's)", err, boom)
	}
}

// TestRunComponentsStartCanceled: a start still running when ctx ends sees
// its context canceled (the startup reconcile ends early).
func TestRunComponentsStartCanceled(t *testing.T) {
	log := ktesting.NewLogger(t, ktesting.NewConfig())
	ctx, cancel := context.WithCancel(t.Context())
	err := components{log, []component{{name: "slow", start: func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	}}}}.run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want the start's context.Canceled", err)
	}
}

// TestRunComponentsEndedBeforeStart: nothing starts once ctx has ended.
func TestRunComponentsEndedBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	tr := &trace{}
	if err := (components{ktesting.NewLogger(t, ktesting.NewConfig()), []component{tr.traced("a", nil, nil, nil)}}).run(ctx); err != nil || len(tr.got) != 0 {
		t.Fatalf("%v %q, want nothing started", err, tr.got)
	}
}
