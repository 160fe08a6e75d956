package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
)

// DefaultPerPodPerMinute is the default rate limit of events about one pod
// (Options.PerPodPerMinute).
const DefaultPerPodPerMinute = 5

// DefaultPerNodePerMinute is the default rate limit of all the events of one
// node (Options.PerNodePerMinute): at most one write every 6 s once its burst
// is spent, 834 per second from 5,000 nodes failing at once. The kubelet
// allows itself 50 per second (eventRecordQPS).
const DefaultPerNodePerMinute = 10

// maxMessage is the longest event message the API server stores in full.
const maxMessage = 1024

// maxPending is how many events are queued, before Run and while it runs.
const maxPending = 1000

// defaultFlushTimeout bounds how long Run waits, once its context ended, for
// the events queued before to be written.
const defaultFlushTimeout = 5 * time.Second

// aggregateWindow is how long a written event takes repeats into its count;
// maxTracked bounds the events and pods remembered for that and for the rate
// limit (the oldest are forgotten first).
const (
	aggregateWindow = 10 * time.Minute
	maxTracked      = 4096
)

// attempts and retryDelay: each write is tried this often, about this far
// apart (jittered: half to one and a half times).
var (
	attempts   = 3
	retryDelay = time.Second
)

// Client writes core/v1 Events, each in its own namespace. kube.Client.Events
// is one; with a client-go clientset, wrap clientset.CoreV1().Events(ns)'s
// Create and Patch (types.MergePatchType).
type Client interface {
	// Create creates e in e.Namespace.
	Create(ctx context.Context, e *corev1.Event) (*corev1.Event, error)
	// Patch applies the JSON merge patch data to the event namespace/name.
	Patch(ctx context.Context, namespace, name string, data []byte) (*corev1.Event, error)
}

// Options configure a Recorder.
type Options struct {
	// Client writes the events: kube.Client.Events. Required.
	Client Client
	// DriverName is the events' source component and reporting controller:
	// the CSI driver name. Required.
	DriverName string
	// NodeName is the events' source host and reporting instance: the
	// Kubernetes node the driver runs on (framework.Options.Node.ID). Required.
	NodeName string
	// PerPodPerMinute is how many events about one pod are written per minute,
	// after a burst of as many. Defaults to DefaultPerPodPerMinute when zero;
	// negative is an error.
	PerPodPerMinute int
	// PerNodePerMinute is how many events of any object this Recorder (one
	// per node) writes per minute, after a burst of as many; a merged repeat
	// counts as a write. Half of it (rounded down) is a reserve that only
	// quiet objects take: an object that has spent more than half its own
	// PerPodPerMinute gets none of it, so that a few noisy pods cannot spend
	// the node's budget for all the others (see the package documentation).
	// Defaults to DefaultPerNodePerMinute when zero; negative is an error.
	PerNodePerMinute int
	// Logger logs events that cannot be written or are dropped. Defaults to
	// klog.Background().
	Logger klog.Logger

	// clock drives the rate limiter and timestamps in tests. Defaults to the
	// real clock.
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
		errs = append(errs, errors.New("NodeName is required (the Kubernetes node name, framework.Options.Node.ID)"))
	}
	if o.PerPodPerMinute < 0 {
		errs = append(errs, fmt.Errorf("PerPodPerMinute %d must not be negative (0 takes the default, %d)", o.PerPodPerMinute, DefaultPerPodPerMinute))
	}
	if o.PerNodePerMinute < 0 {
		errs = append(errs, fmt.Errorf("PerNodePerMinute %d must not be negative (0 takes the default, %d)", o.PerNodePerMinute, DefaultPerNodePerMinute))
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
	if o.PerNodePerMinute == 0 {
		o.PerNodePerMinute = DefaultPerNodePerMinute
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
	opts  Options
	queue chan event

	mu      sync.Mutex
	phase   phase
	pending []event // sent before Run; at most maxPending

	// Used by Run's goroutine only.
	buckets map[string]*bucket  // rate limit per pod
	node    *bucket             // rate limit of the node, nil until the first event
	written map[string]*written // aggregation per event
	seq     uint64              // events created, for unique names
}

type phase int

const (
	idle    phase = iota // before Run: events are kept in pending
	running              // events go to the queue
	stopped              // Run returned: events are dropped
)

// event is one call of Event or CSIDriverEvent: what it is about, and the
// namespace the Event object is written in.
type event struct {
	ref                        corev1.ObjectReference
	namespace                  string
	eventType, reason, message string
}

// bucket is a token bucket: tokens refill at the per-minute rate up to burst.
type bucket struct {
	tokens float64
	last   time.Time
}

// written is an event written recently, for merging repeats into it.
type written struct {
	namespace, name string
	count           int32
	last            time.Time
}

// New checks opts and returns a Recorder. It starts nothing: Run does.
func New(opts Options) (*Recorder, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	return &Recorder{
		opts:    opts,
		queue:   make(chan event, maxPending),
		buckets: map[string]*bucket{},
		written: map[string]*written{},
	}, nil
}

// Run writes the events sent so far and then each event as it comes, until
// ctx ends. It then stops taking events, writes those still queued for a few
// seconds at most and returns nil. A Recorder runs once: a second Run returns
// an error at once.
func (r *Recorder) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.phase != idle {
		r.mu.Unlock()
		return errors.New("events: the Recorder has already run")
	}
	for _, e := range r.pending {
		r.queue <- e // the queue holds maxPending: never blocks
	}
	r.pending = nil
	r.phase = running
	r.mu.Unlock()

	// Writes outlive ctx by the flush timeout: the events queued when the
	// driver stops are worth writing (a failure at shutdown).
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	for {
		select {
		case e := <-r.queue:
			r.write(wctx, e)
			continue
		case <-ctx.Done():
		}
		break
	}

	r.mu.Lock()
	r.phase = stopped
	r.mu.Unlock()
	timer := time.AfterFunc(r.opts.flushTimeout, cancel)
	defer timer.Stop()
	for {
		select {
		case e := <-r.queue:
			if wctx.Err() != nil {
				r.opts.Logger.Info("Stopping with events not yet written; they are dropped", logkeys.Timeout, r.opts.flushTimeout, logkeys.Count, len(r.queue)+1)
				return nil
			}
			r.write(wctx, e)
		default:
			return nil
		}
	}
}

// Event implements framework.EventSink: it queues an event about pod. It never
// blocks; see the package documentation for when the event is written.
func (r *Recorder) Event(pod api.Pod, eventType, reason, message string) {
	r.post(podEvent(pod, eventType, reason, message))
}

// podEvent is an event about pod.
func podEvent(pod api.Pod, eventType, reason, message string) event {
	return event{
		ref: corev1.ObjectReference{
			APIVersion: "v1",
			Kind:       "Pod",
			Namespace:  pod.Namespace,
			Name:       pod.Name,
			UID:        types.UID(pod.UID),
		},
		namespace: pod.Namespace,
		eventType: eventType, reason: reason, message: message,
	}
}

// CSIDriverEvent implements framework.CSIDriverEventSink: it queues an event
// about the driver's CSIDriver object, as Event does about a pod. The object
// is cluster-scoped, so the event is written in the "default" namespace (as
// the kubelet's events about nodes are); kubectl finds it with
// kubectl get events -A --field-selector involvedObject.kind=CSIDriver.
func (r *Recorder) CSIDriverEvent(obj api.CSIDriver, eventType, reason, message string) {
	r.post(event{
		ref: corev1.ObjectReference{
			APIVersion: "storage.k8s.io/v1",
			Kind:       "CSIDriver",
			Name:       obj.Name,
			UID:        types.UID(obj.UID),
		},
		namespace: metav1.NamespaceDefault,
		eventType: eventType, reason: reason, message: message,
	})
}

// post queues e; see Event.
func (r *Recorder) post(e event) {
	e.message = truncate(e.message, maxMessage)
	ref := e.ref
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.phase {
	case running:
		select {
		case r.queue <- e:
		default:
			r.opts.Logger.V(4).Info("Dropping an event: the queue is full", logkeys.Object, klog.KRef(ref.Namespace, ref.Name), logkeys.Reason, e.reason)
		}
	case idle:
		if len(r.pending) < maxPending {
			r.pending = append(r.pending, e)
			return
		}
		r.opts.Logger.V(4).Info("Dropping an event: too many sent before the recorder runs", logkeys.Object, klog.KRef(ref.Namespace, ref.Name), logkeys.Reason, e.reason)
	case stopped:
		r.opts.Logger.V(4).Info("Dropping an event: the recorder has stopped", logkeys.Object, klog.KRef(ref.Namespace, ref.Name), logkeys.Reason, e.reason)
	}
}

// write writes e: dropped when its pod is over its rate, merged into an
// identical event written in the last aggregateWindow, created otherwise.
func (r *Recorder) write(ctx context.Context, e event) {
	log := r.opts.Logger.WithValues(logkeys.Object, klog.KRef(e.ref.Namespace, e.ref.Name), logkeys.Reason, e.reason)
	now := r.opts.clock.Now()
	b := r.bucketOf(e.ref, now)
	perPod := float64(r.opts.PerPodPerMinute)
	// A pod that has spent more than half its own budget recently is noisy:
	// it may not take the node's reserve.
	noisy := b.tokens < perPod/2
	if !b.take(now, perPod, 0) {
		log.V(4).Info("Dropping an event: its object is over its rate (PerPodPerMinute)", logkeys.PerMinute, r.opts.PerPodPerMinute)
		return
	}
	perNode := float64(r.opts.PerNodePerMinute)
	if r.node == nil {
		r.node = &bucket{tokens: perNode, last: now}
	}
	keep := 0.0
	if noisy {
		keep = float64(r.opts.PerNodePerMinute / 2)
	}
	if !r.node.take(now, perNode, keep) {
		log.V(4).Info("Dropping an event: the node is over its rate (PerNodePerMinute), or only its reserve for quiet objects is left", logkeys.PerMinute, r.opts.PerNodePerMinute)
		return
	}
	key := string(e.ref.UID) + "\x00" + e.ref.Kind + "\x00" + e.ref.Namespace + "\x00" + e.ref.Name + "\x00" + e.eventType + "\x00" + e.reason + "\x00" + normalize(e.message)
	if w := r.written[key]; w != nil && now.Sub(w.last) < aggregateWindow {
		patch, _ := json.Marshal(map[string]any{"count": w.count + 1, "lastTimestamp": metav1.NewTime(now), "message": e.message})
		err := r.retry(ctx, func() error {
			_, err := r.opts.Client.Patch(ctx, w.namespace, w.name, patch)
			return err
		})
		if err == nil {
			w.count++
			w.last = now
			return
		}
		if !apierrors.IsNotFound(err) {
			log.Info("Could not update an event", logkeys.Err, err.Error())
			return
		}
		// Expired or deleted meanwhile: create it anew.
	}
	r.seq++
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// As client-go names them, the object's name and the time, here
			// with a sequence number: two events of one pod in the same
			// nanosecond (a coarse clock) must not collide.
			Name:      e.ref.Name + "." + strconv.FormatInt(now.UnixNano(), 16) + strconv.FormatUint(uint64(0x1000+r.seq%0x1000), 16)[1:],
			Namespace: e.namespace,
		},
		InvolvedObject:      e.ref,
		Reason:              e.reason,
		Message:             e.message,
		Type:                e.eventType,
		Source:              corev1.EventSource{Component: r.opts.DriverName, Host: r.opts.NodeName},
		FirstTimestamp:      metav1.NewTime(now),
		LastTimestamp:       metav1.NewTime(now),
		Count:               1,
		ReportingController: r.opts.DriverName,
		ReportingInstance:   r.opts.NodeName,
	}
	if err := r.retry(ctx, func() error {
		_, err := r.opts.Client.Create(ctx, ev)
		return err
	}); err != nil {
		log.Info("Could not write an event", logkeys.Err, err.Error())
		return
	}
	if len(r.written) >= maxTracked {
		forgetOldest(r.written, func(w *written) time.Time { return w.last })
	}
	r.written[key] = &written{namespace: ev.Namespace, name: ev.Name, count: 1, last: now}
}

// retry calls f up to attempts times, about retryDelay apart (jittered, or as
// long as the API server asks if longer), until it succeeds, ctx ends, or the
// error is one a retry cannot change (the API server refused the event
// itself, or it no longer exists).
func (r *Recorder) retry(ctx context.Context, f func() error) error {
	var err error
	for i := range attempts {
		if err = f(); err == nil || apierrors.IsNotFound(err) || apierrors.IsInvalid(err) ||
			apierrors.IsForbidden(err) || apierrors.IsAlreadyExists(err) || apierrors.IsBadRequest(err) {
			return err
		}
		if i == attempts-1 {
			break
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(retryWait(err)):
		}
	}
	return err
}

// retryWait is how long to wait before retrying after err: retryDelay
// jittered to half to one and a half times, or the delay the API server
// suggested (Retry-After of a 429 or 5xx) if longer.
func retryWait(err error) time.Duration {
	d := time.Duration(float64(retryDelay) * (0.5 + rand.Float64()))
	if s, ok := apierrors.SuggestsClientDelay(err); ok {
		d = max(d, time.Duration(s)*time.Second)
	}
	return d
}

// normalize is message as the aggregation key holds it: each run of digits
// (with the separators within a number) becomes "#", so that a message that
// differs only in numbers (sizes, counts, durations) is a repeat.
func normalize(message string) string {
	var b strings.Builder
	inNumber := false
	for i := 0; i < len(message); i++ {
		c := message[i]
		switch {
		case c >= '0' && c <= '9':
			if !inNumber {
				b.WriteByte('#')
				inNumber = true
			}
		case inNumber && (c == '.' || c == ',') && i+1 < len(message) && message[i+1] >= '0' && message[i+1] <= '9':
			// within a number: 1.5, 10,000
		default:
			inNumber = false
			b.WriteByte(c)
		}
	}
	return b.String()
}

// bucketOf is the object's bucket, refilled to now: PerPodPerMinute per
// minute up to a burst of as many. At most maxTracked objects are tracked,
// those written longest ago forgotten first.
func (r *Recorder) bucketOf(ref corev1.ObjectReference, now time.Time) *bucket {
	key := ref.Kind + "/" + ref.Namespace + "/" + ref.Name + "/" + string(ref.UID)
	burst := float64(r.opts.PerPodPerMinute)
	b := r.buckets[key]
	if b == nil {
		if len(r.buckets) >= maxTracked {
			forgetOldest(r.buckets, func(b *bucket) time.Time { return b.last })
		}
		b = &bucket{tokens: burst, last: now}
		r.buckets[key] = b
	}
	b.refill(now, burst)
	return b
}

// refill refills b at perMinute per minute up to a burst of as many.
func (b *bucket) refill(now time.Time, perMinute float64) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(perMinute, b.tokens+d.Minutes()*perMinute)
		b.last = now
	}
}

// take refills b and takes a token if one is left beyond keep.
func (b *bucket) take(now time.Time, perMinute, keep float64) bool {
	b.refill(now, perMinute)
	if b.tokens < 1+keep {
		return false
	}
	b.tokens--
	return true
}

// forgetOldest drops the eighth of m used longest ago, so that a full map is
// trimmed once per many additions.
func forgetOldest[V any](m map[string]V, last func(V) time.Time) {
	times := make([]time.Time, 0, len(m))
	for _, v := range m {
		times = append(times, last(v))
	}
	slices.SortFunc(times, time.Time.Compare)
	cut := times[len(times)/8]
	for k, v := range m {
		if !last(v).After(cut) {
			delete(m, k)
		}
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
