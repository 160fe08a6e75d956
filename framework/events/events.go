// Package events posts the framework's pod events (framework.EventSink) to the
// Kubernetes API as core/v1 Events, through client-go's event broadcaster.
//
// The framework itself has no Kubernetes client; a driver that wants events
// builds a Recorder and passes it as Options.Events:
//
//	rec := events.NewRecorder(client, opts.DriverName, opts.NodeID)
//	defer rec.Shutdown()
//	opts.Events = rec
//
// The driver's service account needs create and patch on events (core group).
//
// # Rate limiting
//
// A pod whose volume keeps failing is retried by the kubelet with backoff, and
// each attempt would be an event. The broadcaster's spam filter, keyed here by
// pod (whatever the event's type or reason), lets through a burst of
// PerPodPerMinute events and then PerPodPerMinute per minute; the rest are
// dropped. Identical events within the window are merged into one Event with a
// count, as kubectl shows them.
//
// Event never blocks: events are queued and written by a background goroutine
// (dropped when the queue is full or the API server is unreachable for long).
package events

import (
	"context"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/ephemera-csi/ephemera/api"
)

// DefaultPerPodPerMinute is the default rate limit of events about one pod.
const DefaultPerPodPerMinute = 5

// maxMessage is the longest event message the API server stores in full.
const maxMessage = 1024

// Recorder is a framework.EventSink that posts events to the API server. Create
// it with NewRecorder; stop it with Shutdown.
type Recorder struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// Option configures a Recorder.
type Option func(*config)

type config struct {
	perMinute int
	logger    klog.Logger
	clock     clock.PassiveClock
}

// WithRateLimit sets how many events about one pod go out per minute (after a
// burst of as many). Values below 1 keep the default, DefaultPerPodPerMinute.
func WithRateLimit(perPodPerMinute int) Option {
	return func(c *config) {
		if perPodPerMinute > 0 {
			c.perMinute = perPodPerMinute
		}
	}
}

// WithLogger sets the logger for failures to write events. Defaults to
// klog.Background().
func WithLogger(l klog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// withClock drives the rate limiter in tests.
func withClock(clk clock.PassiveClock) Option {
	return func(c *config) { c.clock = clk }
}

// NewRecorder returns a Recorder posting events as component driverName on
// host nodeName, and starts its background writer.
func NewRecorder(client kubernetes.Interface, driverName, nodeName string, opts ...Option) *Recorder {
	c := config{perMinute: DefaultPerPodPerMinute, logger: klog.Background(), clock: clock.RealClock{}}
	for _, o := range opts {
		o(&c)
	}
	b := record.NewBroadcaster(
		record.WithContext(klog.NewContext(context.Background(), c.logger)),
		record.WithCorrelatorOptions(record.CorrelatorOptions{
			BurstSize:   c.perMinute,
			QPS:         float32(c.perMinute) / 60,
			SpamKeyFunc: podKey,
			Clock:       c.clock,
		}),
	)
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &Recorder{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: driverName, Host: nodeName}),
	}
}

// podKey makes the spam filter count all events about one pod together.
func podKey(e *corev1.Event) string {
	o := e.InvolvedObject
	return strings.Join([]string{e.Source.Component, e.Source.Host, o.Namespace, o.Name, string(o.UID)}, "/")
}

// Event implements framework.EventSink: it queues an event about pod.
func (r *Recorder) Event(pod api.Pod, eventType, reason, message string) {
	ref := &corev1.ObjectReference{
		APIVersion: "v1",
		Kind:       "Pod",
		Namespace:  pod.Namespace,
		Name:       pod.Name,
		UID:        types.UID(pod.UID),
	}
	r.recorder.Event(ref, eventType, reason, truncate(message, maxMessage))
}

// Shutdown stops the background writer; queued events may be lost.
func (r *Recorder) Shutdown() { r.broadcaster.Shutdown() }

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
