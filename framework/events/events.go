// Package events posts the framework's pod events (framework.EventSink) to the
// Kubernetes API as core/v1 Events, through client-go's event broadcaster.
//
// The framework itself has no Kubernetes client; a driver that wants events
// builds a Recorder and passes it both as Options.Events (where events go) and
// among Options.Runnables (so the driver runs it). Its client is kube.Client's
// (which links core/v1 only), or client-go's typedcorev1.EventSinkImpl:
//
//	client, err := kube.NewClient(cfg)
//	if err != nil {
//		return err
//	}
//	rec, err := events.New(events.Options{Client: client.Events(), DriverName: opts.DriverName, NodeName: opts.NodeID})
//	if err != nil {
//		return err
//	}
//	opts.Events = rec
//	opts.Runnables = append(opts.Runnables, rec)
//
// New only checks the options; Run starts the broadcaster, writes events until
// its context ends, then flushes what it can and stops. Without the driver,
// run it yourself: go rec.Run(ctx).
//
// The driver's service account needs create and patch on events (core group).
//
// # Rate limiting
//
// A pod whose volume keeps failing is retried by the kubelet with backoff, and
// each attempt would be an event. The broadcaster's spam filter, keyed here by
// pod (whatever the event's type or reason), lets through a burst of
// Options.PerPodPerMinute events (DefaultPerPodPerMinute) and then as many per
// minute; the rest are dropped. Identical events within the window are merged
// into one Event with a count, as kubectl shows them.
//
// # When events are written
//
// Event never blocks and never fails. While Run runs, events are queued and
// written by the broadcaster's goroutine (dropped when its queue of 1000 is
// full, or after retries when the API server stays unreachable). Events sent
// before Run starts are kept, up to 1000, and handed to the broadcaster when it
// does: the driver starts its runnables only after its startup reconcile, and
// a publish may race with Run's start. Events sent after Run returned are
// dropped (logged at V(4)): nothing would write them.
package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
)

// DefaultPerPodPerMinute is the default rate limit of events about one pod
// (Options.PerPodPerMinute).
const DefaultPerPodPerMinute = 5

// maxMessage is the longest event message the API server stores in full.
const maxMessage = 1024

// maxPending is how many events sent before Run are kept for it: as many as
// the broadcaster itself queues.
const maxPending = 1000

// defaultFlushTimeout bounds how long Run waits, once its context ended, for
// the events queued before to be written.
const defaultFlushTimeout = 5 * time.Second

// Options configure a Recorder.
type Options struct {
	// Client writes the events, each in its namespace: kube.Client.Events, or
	// client-go's &typedcorev1.EventSinkImpl{Interface:
	// clientset.CoreV1().Events("")}. Required.
	Client record.EventSink
	// DriverName is the events' source component and reporting controller:
	// the CSI driver name. Required.
	DriverName string
	// NodeName is the events' source host and reporting instance: the
	// Kubernetes node the driver runs on (framework.Options.NodeID). Required.
	NodeName string
	// PerPodPerMinute is how many events about one pod are written per minute,
	// after a burst of as many. Defaults to DefaultPerPodPerMinute when zero;
	// negative is an error.
	PerPodPerMinute int
	// Logger logs events that cannot be written or are dropped. Defaults to
	// klog.Background().
	Logger klog.Logger

	// clock drives the rate limiter in tests. Defaults to the real clock.
	clock clock.PassiveClock
	// flushTimeout overrides defaultFlushTimeout in tests.
	flushTimeout time.Duration
}

func (o *Options) validate() error {
	var errs []error
	if o.Client == nil {
		errs = append(errs, errors.New("option Client is required"))
	}
	if o.DriverName == "" {
		errs = append(errs, errors.New("DriverName is required"))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("NodeName is required (the Kubernetes node name, framework.Options.NodeID)"))
	}
	if o.PerPodPerMinute < 0 {
		errs = append(errs, fmt.Errorf("PerPodPerMinute %d must not be negative (0 takes the default, %d)", o.PerPodPerMinute, DefaultPerPodPerMinute))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("events: invalid options: %w", err)
	}
	return nil
}

func (o *Options) setDefaults() {
	if o.PerPodPerMinute == 0 {
		o.PerPodPerMinute = DefaultPerPodPerMinute
	}
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background()
	}
	if o.clock == nil {
		o.clock = clock.RealClock{}
	}
	if o.flushTimeout == 0 {
		o.flushTimeout = defaultFlushTimeout
	}
}

// Recorder is a framework.EventSink that posts events to the API server.
// Create it with New and run it with Run (normally as one of the driver's
// Options.Runnables).
type Recorder struct {
	opts Options

	mu       sync.Mutex
	phase    phase
	pending  []event              // sent before Run; at most maxPending
	recorder record.EventRecorder // while running
}

type phase int

const (
	idle    phase = iota // before Run: events are kept in pending
	running              // events go to the broadcaster
	stopped              // Run returned: events are dropped
)

// event is one call of Event, kept until Run starts.
type event struct {
	ref                        *corev1.ObjectReference
	eventType, reason, message string
}

// New checks opts and returns a Recorder. It starts nothing: Run does.
func New(opts Options) (*Recorder, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	return &Recorder{opts: opts}, nil
}

// Run starts the broadcaster, hands it the events sent so far and writes
// events until ctx ends. It then stops taking events, waits a few seconds at
// most for those queued to be written, shuts the broadcaster down and returns
// nil. A Recorder runs once: a second Run returns an error at once.
func (r *Recorder) Run(ctx context.Context) error {
	log := r.opts.Logger
	r.mu.Lock()
	if r.phase != idle {
		r.mu.Unlock()
		return errors.New("events: the Recorder has already run")
	}
	// The broadcaster's context only carries the logger: Run shuts it down
	// itself, after the flush.
	b := record.NewBroadcaster(
		record.WithContext(klog.NewContext(context.WithoutCancel(ctx), log)),
		record.WithCorrelatorOptions(record.CorrelatorOptions{
			BurstSize:   r.opts.PerPodPerMinute,
			QPS:         float32(r.opts.PerPodPerMinute) / 60,
			SpamKeyFunc: podKey,
			Clock:       r.opts.clock,
		}),
	)
	sink := &flushSink{
		EventSink: r.opts.Client,
		flushed:   make(chan struct{}),
	}
	b.StartRecordingToSink(sink)
	// The recorder consults its scheme only to make a reference to an object;
	// every event here is about a pod given by reference, used as is. So the
	// scheme is empty (client-go's kubernetes/scheme registers every API
	// group).
	r.recorder = b.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: r.opts.DriverName, Host: r.opts.NodeName}).WithLogger(log)
	for _, e := range r.pending {
		r.recorder.Event(e.ref, e.eventType, e.reason, e.message)
	}
	r.pending = nil
	r.phase = running
	r.mu.Unlock()

	<-ctx.Done()

	// The broadcaster writes in order: once the flush marker, sent after
	// every other event, reaches the sink, they were all written (or given up
	// on, or rate limited).
	r.mu.Lock()
	r.phase = stopped
	r.recorder.Event(flushMarker, corev1.EventTypeNormal, flushReason, "")
	r.recorder = nil
	r.mu.Unlock()
	select {
	case <-sink.flushed:
	case <-time.After(r.opts.flushTimeout):
		log.Info("Stopping with events not yet written; they are dropped", logkeys.Timeout, r.opts.flushTimeout)
	}
	b.Shutdown()
	return nil
}

// The flush marker is an event about an object no real event is about, so
// the per-pod spam filter always lets it through; the sink swallows it.
const flushReason = "EphemeraEventsFlush"

var flushMarker = &corev1.ObjectReference{
	APIVersion: "v1",
	Kind:       "Pod",
	Namespace:  "ephemera-events-flush",
	Name:       "flush",
	UID:        "ephemera-events-flush",
}

// flushSink writes events to the API server, except the flush marker, whose
// arrival it signals instead.
type flushSink struct {
	record.EventSink
	flushed chan struct{}
	once    sync.Once
}

func (s *flushSink) isMarker(e *corev1.Event) bool {
	return e.InvolvedObject.UID == flushMarker.UID && e.Reason == flushReason
}

func (s *flushSink) Create(e *corev1.Event) (*corev1.Event, error) {
	if s.isMarker(e) {
		s.once.Do(func() { close(s.flushed) })
		return e, nil
	}
	return s.EventSink.Create(e)
}

func (s *flushSink) Update(e *corev1.Event) (*corev1.Event, error) {
	if s.isMarker(e) {
		return e, nil
	}
	return s.EventSink.Update(e)
}

func (s *flushSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	if s.isMarker(e) {
		return e, nil
	}
	return s.EventSink.Patch(e, data)
}

// podKey makes the spam filter count all events about one pod together.
func podKey(e *corev1.Event) string {
	o := e.InvolvedObject
	return strings.Join([]string{e.Source.Component, e.Source.Host, o.Namespace, o.Name, string(o.UID)}, "/")
}

// Event implements framework.EventSink: it queues an event about pod. It never
// blocks; see the package documentation for when the event is written.
func (r *Recorder) Event(pod api.Pod, eventType, reason, message string) {
	ref := &corev1.ObjectReference{
		APIVersion: "v1",
		Kind:       "Pod",
		Namespace:  pod.Namespace,
		Name:       pod.Name,
		UID:        types.UID(pod.UID),
	}
	r.post(ref, eventType, reason, message)
}

// CSIDriverEvent implements framework.CSIDriverEventSink: it queues an event
// about the driver's CSIDriver object, as Event does about a pod. The object
// is cluster-scoped, so the event is written in the "default" namespace (as
// the kubelet's events about nodes are); kubectl finds it with
// kubectl get events -A --field-selector involvedObject.kind=CSIDriver.
func (r *Recorder) CSIDriverEvent(obj api.CSIDriver, eventType, reason, message string) {
	ref := &corev1.ObjectReference{
		APIVersion: "storage.k8s.io/v1",
		Kind:       "CSIDriver",
		Name:       obj.Name,
		UID:        types.UID(obj.UID),
	}
	r.post(ref, eventType, reason, message)
}

// post queues an event about ref; see Event.
func (r *Recorder) post(ref *corev1.ObjectReference, eventType, reason, message string) {
	message = truncate(message, maxMessage)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.phase {
	case running:
		// Never blocks: the broadcaster drops events when its queue is full.
		r.recorder.Event(ref, eventType, reason, message)
	case idle:
		if len(r.pending) < maxPending {
			r.pending = append(r.pending, event{ref, eventType, reason, message})
			return
		}
		r.opts.Logger.V(4).Info("Dropping an event: too many sent before the recorder runs", logkeys.Object, klog.KRef(ref.Namespace, ref.Name), logkeys.Reason, reason)
	case stopped:
		r.opts.Logger.V(4).Info("Dropping an event: the recorder has stopped", logkeys.Object, klog.KRef(ref.Namespace, ref.Name), logkeys.Reason, reason)
	}
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
