package kube

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/spread"
)

const uidIndex = "uid"

// defaultSyncTimeout is PodsOptions.SyncTimeout's default.
const defaultSyncTimeout = time.Minute

// DefaultStartJitter is PodsOptions.StartJitter's default.
const DefaultStartJitter = 5 * time.Second

// FleetStartJitter is the window over which Pods spreads its first list when
// PodsOptions.FleetSize says drivers may start at once: 50 ms per driver
// (about 20 starts a second), at least DefaultStartJitter (up to 100
// drivers), at most five minutes (6,000 drivers and more). A driver that
// spreads other start-up work of its own may use it too.
func FleetStartJitter(drivers int) time.Duration {
	return spread.Window(drivers, DefaultStartJitter)
}

// FleetSizeWait is how long the framework's start-up work (Pods' first list,
// the CSIDriver check) waits for FleetSize.Size: the read at its point of
// FleetSizeReadWindow and 10 s for the read itself. A driver that spreads
// start-up work of its own as they do waits as long.
const FleetSizeWait = spread.SizeTimeout

// FleetStartRest is what start-up work spread as Pods' first list waits once
// it has learnt the fleet's window w, after a delay d drawn from [0, least)
// before it asked: the same fraction of w as d is of least, less d (0 when w
// is no longer than least). So the work of a fleet whose size was remembered
// falls uniformly over w; the time the answer took is not taken off, so that
// a first start's work, whose answers come over FleetSizeReadWindow, never
// bunches up.
func FleetStartRest(d, least, w time.Duration) time.Duration {
	return spread.Rest(d, least, w)
}

// PodsOptions configure Pods.
type PodsOptions struct {
	// Client lists and watches the pods of all namespaces: Client.Pods, or
	// client-go's clientset.CoreV1().Pods(""). Required.
	Client PodsClient
	// NodeName is the Kubernetes node whose pods are watched (field selector
	// spec.nodeName): the node the driver runs on, framework.Options.Node.ID.
	// Required.
	NodeName string
	// Resync is the informer's resync period. Defaults to 0: no resync (the
	// watch keeps the cache current). Negative is an error.
	Resync time.Duration
	// SyncTimeout is how long Run waits for the informer's first sync before
	// it logs an error. Run keeps running and PodExists keeps failing until
	// the sync, which the orphan GC takes as "unknown": it keeps the volumes.
	// Defaults to one minute. Negative is an error.
	SyncTimeout time.Duration
	// StartJitter is the longest random delay Run waits before the first
	// list: when every driver of a fleet restarts at once (a rollout, a node
	// image update, the API server back from an outage), their lists reach
	// the API server spread over this time, not in one burst. The orphan GC
	// keeps every orphan until the informer synced, so a delay costs nothing
	// but a later first GC pass. Defaults to DefaultStartJitter when zero;
	// negative means no delay.
	StartJitter time.Duration
	// FleetSize, when set, returns how many drivers may start at once with
	// this one: its DaemonSet's desiredNumberScheduled, FleetSize.Size
	// (which remembers it from the last start and spreads a first start's
	// read over FleetSizeReadWindow). Run asks it once, after a random
	// fraction f of StartJitter, and lists after f of the rest of the fleet's
	// window (FleetStartJitter's, no shorter than StartJitter) from the
	// answer: a fleet-wide restart of 1,000 drivers lists over
	// 50 s, 5,000 over about four minutes, at about 20 drivers a second. An
	// error (RBAC, the API server down), or no answer within FleetSizeWait
	// (40 s), leaves StartJitter, logged. Ignored
	// when StartJitter is negative. Defaults to nil: StartJitter.
	FleetSize func(ctx context.Context) (int, error)
	// Logger logs the sync. Defaults to klog.Background().
	Logger klog.Logger

	// delay picks the delay before the first list from [0, StartJitter).
	// Defaults to a uniformly random one; tests set it.
	delay func(max time.Duration) time.Duration
	// sleep waits d or until ctx ends, and reports whether d passed.
	// Defaults to a timer; tests set it.
	sleep func(ctx context.Context, d time.Duration) bool
}

func (o *PodsOptions) validate() error {
	var errs []error
	if o.Client == nil {
		errs = append(errs, errors.New("option Client is required"))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("NodeName is required (the Kubernetes node name, framework.Options.Node.ID)"))
	}
	if o.Resync < 0 {
		errs = append(errs, fmt.Errorf("option Resync %s must not be negative (0: no resync)", o.Resync))
	}
	if o.SyncTimeout < 0 {
		errs = append(errs, fmt.Errorf("SyncTimeout %s must not be negative (0 takes the default, %s)", o.SyncTimeout, defaultSyncTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kube: invalid PodsOptions: %w", err)
	}
	return nil
}

func (o *PodsOptions) setDefaults() {
	if o.SyncTimeout == 0 {
		o.SyncTimeout = defaultSyncTimeout
	}
	if o.StartJitter == 0 {
		o.StartJitter = DefaultStartJitter
	}
	if o.delay == nil {
		o.delay = func(max time.Duration) time.Duration { return rand.N(max) }
	}
	if o.sleep == nil {
		o.sleep = sleepCtx
	}
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background()
	}
}

// Pods answers framework.PodChecker from a pod informer restricted to one node
// (field selector spec.nodeName), indexed by UID: the orphan GC asks it whether
// the pod of a volume whose directory is gone still exists before removing the
// volume. Create it with NewPods and run it with Run (normally as one of the
// driver's Options.Runnables).
type Pods struct {
	opts     PodsOptions
	informer cache.SharedIndexInformer
	ran      atomic.Bool
}

// NewPods checks opts and builds the informer. It starts nothing and makes no
// API call: Run does.
func NewPods(opts PodsOptions) (*Pods, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	selector := fields.OneTermEqualSelector("spec.nodeName", opts.NodeName).String()
	pods := opts.Client
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(listThenWatch{lw}, &corev1.Pod{}, opts.Resync,
		cache.Indexers{uidIndex: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok {
				return []string{string(p.UID)}, nil
			}
			return nil, nil
		}})
	// The cache keeps what PodExists needs of a pod, not its spec and status
	// (a pod with its managed fields is often 10 KiB or more).
	if err := inf.SetTransform(podIdentity); err != nil {
		return nil, err
	}
	return &Pods{opts: opts, informer: inf}, nil
}

// listThenWatch is the informer's ListerWatcher: it tells the reflector that
// it cannot stream the initial list in a watch (client-go's WatchListClient,
// on by default since v0.35), so the reflector LISTs, then watches from the
// list's resource version.
//
// The reason is the API server's cost of a driver's (re)start. A LIST of the
// pods with spec.nodeName=NODE at resourceVersion 0 is served from the watch
// cache through its spec.nodeName index: O(pods of the node). A watch-list
// (sendInitialEvents=true) builds its initial events by walking every pod of
// the cluster in the watch cache and filtering each: O(pods of the cluster),
// paid by every driver that starts, all 5,000 of them when a fleet restarts
// at once (docs/operations.md, "At fleet scale").
type listThenWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported makes the reflector list, then watch.
func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

// podIdentity is the informer's transform: a pod becomes its namespace, name,
// UID and resource version.
func podIdentity(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a cache.DeletedFinalStateUnknown, kept as is
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
	}}, nil
}

// Run waits a random part of StartJitter (of the fleet's window, with
// FleetSize), starts the informer, waits up to
// SyncTimeout for its first sync and
// blocks until ctx ends; it then stops the informer, waits for its goroutines
// and returns nil. A sync that takes longer is logged as an error, not
// returned: the driver keeps serving while PodExists fails, and Run logs
// again when the sync comes. Pods runs once: a second Run returns an error at
// once.
func (p *Pods) Run(ctx context.Context) error {
	if !p.ran.CompareAndSwap(false, true) {
		return errors.New("kube: Pods has already run")
	}
	log := p.opts.Logger.WithValues(logkeys.Node, p.opts.NodeName)
	if p.opts.StartJitter > 0 {
		// The delay is a fraction f of the window, drawn once: f of
		// StartJitter is waited before FleetSize is asked (so that a
		// fleet's reads of its size are spread too), f of the rest of the
		// fleet's window after the answer (FleetStartRest). With sizes that
		// answer at once (remembered), every driver's list falls uniformly
		// in the fleet's window; a first start's, after its read, spread
		// over the read's window and the fleet's.
		d := p.opts.delay(p.opts.StartJitter)
		log.V(4).Info("Waiting before the first list of the node's pods (StartJitter)", logkeys.Duration, d)
		if ctx.Err() != nil || d > 0 && !p.opts.sleep(ctx, d) {
			return nil
		}
		window := p.window(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if window > p.opts.StartJitter {
			rest := FleetStartRest(d, p.opts.StartJitter, window)
			log.V(4).Info("Waiting before the first list of the node's pods (the fleet's window)", logkeys.Duration, d+rest, logkeys.Window, window)
			if rest > 0 && !p.opts.sleep(ctx, rest) {
				return nil
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.informer.RunWithContext(ctx) })
	defer wg.Wait() // after ctx ended: waits for the informer's goroutines

	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, p.opts.SyncTimeout)
	synced := cache.WaitForCacheSync(sctx.Done(), p.informer.HasSynced)
	cancel()
	switch {
	case synced:
		log.V(2).Info("Pod informer synced", logkeys.Duration, time.Since(start))
	case ctx.Err() == nil:
		log.Error(nil, "Pod informer not synced; the orphan GC keeps every orphan until it is", logkeys.Timeout, p.opts.SyncTimeout)
		if cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
			log.Info("Pod informer synced", logkeys.Duration, time.Since(start))
		}
	}
	<-ctx.Done()
	return nil
}

// window is the longest delay before the first list: StartJitter, or the
// fleet's window when FleetSize answers.
func (p *Pods) window(ctx context.Context) time.Duration {
	if p.opts.FleetSize == nil {
		return p.opts.StartJitter
	}
	log := p.opts.Logger.WithValues(logkeys.Node, p.opts.NodeName)
	fctx, cancel := context.WithTimeout(ctx, FleetSizeWait)
	n, err := p.opts.FleetSize(fctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			log.Info("Cannot learn how many drivers start with this one; spreading the first pod list over StartJitter", logkeys.Window, p.opts.StartJitter, logkeys.Err, err)
		}
		return p.opts.StartJitter
	}
	w := spread.Window(n, p.opts.StartJitter)
	log.V(2).Info("Spreading the first pod list over the fleet's window", logkeys.Drivers, n, logkeys.Window, w)
	return w
}

// HasSynced reports whether the informer has synced: until then PodExists
// fails. It is a cache.InformerSynced.
func (p *Pods) HasSynced() bool { return p.informer.HasSynced() }

// PodExists implements framework.PodChecker. It fails until the informer has
// synced.
func (p *Pods) PodExists(_ context.Context, uid string) (bool, error) {
	if !p.informer.HasSynced() {
		return false, errors.New("kube: pod informer has not synced yet")
	}
	objs, err := p.informer.GetIndexer().ByIndex(uidIndex, uid)
	if err != nil {
		return false, err
	}
	return len(objs) > 0, nil
}
