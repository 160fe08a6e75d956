package csidriver

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/spread"
)

// Startup is the startup check of the driver's CSIDriver object
// (Options.Observability.CSIDrivers).
type Startup struct {
	Name   string        // the driver's name, the object's
	Jitter time.Duration // Options.Observability.CSIDriverCheckJitter
	// FleetSize, when set, returns how many drivers may start at once with
	// this one (Options.Observability.FleetSize): Run asks it after a random
	// fraction f of Jitter (waiting up to spread.SizeTimeout) and reads after
	// f of the rest of the fleet's window (spread.Window, no shorter than
	// Jitter) from the answer.
	FleetSize func(ctx context.Context) (int, error)
	// Get reads the object, or returns an error wrapping api.ErrNotFound.
	Get func(ctx context.Context, name string) (*api.CSIDriver, error)
	// Observe exports the outcome of one check (the metrics).
	Observe func(check string, failed bool)
	// Event, when set, posts the problems as one Warning event on the
	// object (a CSIDriverEventSink).
	Event func(obj api.CSIDriver, message string)
}

// timeout bounds the startup check's API call (with retries).
const timeout = time.Minute

// Run runs the check: after a random delay of up to Jitter it reads the
// object through Get (retrying transient errors with jittered backoff for up
// to a minute), logs each problem as an error with what to fix, exports every
// check through Observe and posts the problems as one Event. It never stops
// the driver: a publish that the object breaks fails with its own message
// anyway.
func (s *Startup) Run(ctx context.Context) {
	log := klog.FromContext(ctx)
	// A fraction f of Jitter first, then FleetSize, then f of the rest of
	// the fleet's window (spread.Rest): the fleet's reads of its size are
	// spread too, and with sizes that answer at once every driver's check
	// falls uniformly in the fleet's window.
	d := randDuration(s.Jitter)
	if !sleepCtx(ctx, d) {
		return // the driver is stopping
	}
	if w := s.window(ctx); ctx.Err() != nil || w > s.Jitter && !sleepCtx(ctx, spread.Rest(d, s.Jitter, w)) {
		return // the driver is stopping
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	name := s.Name
	var (
		obj *api.CSIDriver
		err error
	)
	for wait := time.Second; ; wait = min(2*wait, 15*time.Second) {
		obj, err = s.Get(ctx, name)
		if err == nil || errors.Is(err, api.ErrNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return // the driver is stopping
			}
			log.Error(err, "Cannot read the CSIDriver object to check it; the driver serves without the check (RBAC: get on csidrivers.storage.k8s.io)", logkeys.CSIDriver, name)
			return
		case <-time.After(jitter(wait)):
		}
	}
	if errors.Is(err, api.ErrNotFound) {
		obj = nil
	}
	problems := Check(name, obj)
	failed := map[string]bool{}
	var msgs []string
	for _, p := range problems {
		failed[p.Check] = true
		msgs = append(msgs, p.Message)
		log.Error(nil, "The CSIDriver object does not fit the driver", logkeys.CSIDriver, name, logkeys.Check, p.Check, logkeys.Fix, p.Message)
	}
	for _, c := range Checks {
		if obj == nil && c != Exists {
			continue // nothing to check
		}
		s.Observe(c, failed[c])
	}
	if len(problems) == 0 {
		log.Info("The CSIDriver object fits the driver", logkeys.CSIDriver, name)
		return
	}
	if s.Event != nil {
		ref := api.CSIDriver{Name: name}
		if obj != nil {
			ref.UID = obj.UID
		}
		s.Event(ref, strings.Join(msgs, "; "))
	}
}

// window is the longest delay before the first read: Jitter, or the fleet's
// window when FleetSize answers (an error leaves Jitter, logged).
func (s *Startup) window(ctx context.Context) time.Duration {
	if s.FleetSize == nil || s.Jitter <= 0 {
		return s.Jitter
	}
	fctx, cancel := context.WithTimeout(ctx, spread.SizeTimeout)
	n, err := s.FleetSize(fctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			klog.FromContext(ctx).Info("Cannot learn how many drivers start with this one; spreading the CSIDriver check over its jitter", logkeys.Window, s.Jitter, logkeys.Err, err)
		}
		return s.Jitter
	}
	return spread.Window(n, s.Jitter)
}

// randDuration is a random duration in [0, d); 0 for d <= 0.
func randDuration(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// jitter is d spread to half to one and a half times d, so that retries of
// many nodes do not fall in step.
func jitter(d time.Duration) time.Duration {
	return d/2 + randDuration(d)
}

// sleepCtx waits d or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
