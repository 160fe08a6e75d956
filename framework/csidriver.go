package framework

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
)

// CSIDriverGetter reads the driver's CSIDriver object (Options.Observability.CSIDrivers).
// kube.Client is one.
type CSIDriverGetter interface {
	// GetCSIDriver returns the CSIDriver object called name, or an error
	// wrapping api.ErrNotFound when there is none.
	GetCSIDriver(ctx context.Context, name string) (*api.CSIDriver, error)
}

// CSIDriverEventSink is implemented by an Options.Observability.Events that can also post
// events about the driver's CSIDriver object (events.Recorder does): the
// startup check of the object posts its findings there.
type CSIDriverEventSink interface {
	CSIDriverEvent(obj api.CSIDriver, eventType, reason, message string)
}

// ReasonCSIDriverMisconfigured (Warning, about the CSIDriver object): the
// startup check found the driver's CSIDriver object missing or set in a way
// that breaks its pods; the message says what to change.
const ReasonCSIDriverMisconfigured = "CSIDriverMisconfigured"

// The checks of the CSIDriver object, as the check label of the
// ephemera_csidriver_misconfigured metric names them.
const (
	CheckCSIDriverExists         = "exists"
	CheckCSIDriverEphemeral      = "volumeLifecycleModes"
	CheckCSIDriverPodInfoOnMount = "podInfoOnMount"
	CheckCSIDriverFSGroupPolicy  = "fsGroupPolicy"
	CheckCSIDriverAttachRequired = "attachRequired"
)

// csiDriverChecks are every check, in the order problems are reported.
var csiDriverChecks = []string{CheckCSIDriverExists, CheckCSIDriverEphemeral, CheckCSIDriverPodInfoOnMount, CheckCSIDriverFSGroupPolicy, CheckCSIDriverAttachRequired}

// CSIDriverProblem is one way a CSIDriver object does not fit the driver.
type CSIDriverProblem struct {
	// Check is one of the CheckCSIDriver constants.
	Check string
	// Message says what is wrong and what to change.
	Message string
}

// fsGroupPolicyFile is the fsGroupPolicy the framework is written for: it
// advertises VOLUME_MOUNT_GROUP, so with File the kubelet hands it the pod's
// fsGroup and does not walk the volume; with None the kubelet passes no
// fsGroup at all, and with ReadWriteOnceWithFSType only for a volume with a
// csi.fsType.
const fsGroupPolicyFile = "File"

// CheckCSIDriver compares the driver's CSIDriver object with what the
// framework needs of it; obj nil means that there is none. It returns the
// problems found, none for a fitting object.
func CheckCSIDriver(name string, obj *api.CSIDriver) []CSIDriverProblem {
	if obj == nil {
		return []CSIDriverProblem{{CheckCSIDriverExists, fmt.Sprintf(
			"there is no CSIDriver object %q: the kubelet refuses every inline volume of this driver (\"volume mode \\\"Ephemeral\\\" not supported\"); apply the driver's manifests (they contain it), with metadata.name equal to the driver name", name)}}
	}
	var p []CSIDriverProblem
	if !slices.Contains(obj.VolumeLifecycleModes, "Ephemeral") {
		p = append(p, CSIDriverProblem{CheckCSIDriverEphemeral, fmt.Sprintf(
			"CSIDriver %s: spec.volumeLifecycleModes %s must include Ephemeral, or the kubelet refuses the driver's inline volumes", name, listOrUnset(obj.VolumeLifecycleModes, "unset, which means [Persistent]"))})
	}
	if obj.PodInfoOnMount == nil || !*obj.PodInfoOnMount {
		p = append(p, CSIDriverProblem{CheckCSIDriverPodInfoOnMount, fmt.Sprintf(
			"CSIDriver %s: spec.podInfoOnMount must be true: without the pod's identity every publish is refused", name)})
	}
	if obj.FSGroupPolicy != nil && *obj.FSGroupPolicy != fsGroupPolicyFile {
		p = append(p, CSIDriverProblem{CheckCSIDriverFSGroupPolicy, fmt.Sprintf(
			"CSIDriver %s: spec.fsGroupPolicy is %s, want File: the driver applies the pod's fsGroup itself (VOLUME_MOUNT_GROUP), which the kubelet does only with File (None: pods with an fsGroup cannot write to their volume)", name, *obj.FSGroupPolicy)})
	} else if obj.FSGroupPolicy == nil {
		p = append(p, CSIDriverProblem{CheckCSIDriverFSGroupPolicy, fmt.Sprintf(
			"CSIDriver %s: spec.fsGroupPolicy is unset (ReadWriteOnceWithFSType), want File: the kubelet then passes the pod's fsGroup only for volumes with a csi.fsType", name)})
	}
	if obj.AttachRequired == nil || *obj.AttachRequired {
		p = append(p, CSIDriverProblem{CheckCSIDriverAttachRequired, fmt.Sprintf(
			"CSIDriver %s: spec.attachRequired must be false: this node-only driver has no attacher, so pods wait for a VolumeAttachment forever", name)})
	}
	return p
}

func listOrUnset(l []string, unset string) string {
	if len(l) == 0 {
		return unset
	}
	return "[" + strings.Join(l, ", ") + "]"
}

// csiDriverCheckTimeout bounds the startup check's API call (with retries).
var csiDriverCheckTimeout = time.Minute

// checkCSIDriverObject runs the startup check of the CSIDriver object: after
// a random delay of up to Options.Observability.CSIDriverCheckJitter it reads it through
// Options.Observability.CSIDrivers (retrying transient errors with jittered
// backoff for up to a minute), logs each problem as an error with what to fix, exports
// ephemera_csidriver_misconfigured for every check and posts the problems as
// one Warning event on the object. It never stops the driver: a publish that
// the object breaks fails with its own message anyway.
func (d *Driver) checkCSIDriverObject(ctx context.Context) {
	log := klog.FromContext(ctx)
	if !sleepCtx(ctx, randDuration(d.opts.Observability.CSIDriverCheckJitter)) {
		return // the driver is stopping
	}
	ctx, cancel := context.WithTimeout(ctx, csiDriverCheckTimeout)
	defer cancel()
	name := d.opts.DriverName
	var (
		obj *api.CSIDriver
		err error
	)
	for wait := time.Second; ; wait = min(2*wait, 15*time.Second) {
		obj, err = d.opts.Observability.CSIDrivers.GetCSIDriver(ctx, name)
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
	problems := CheckCSIDriver(name, obj)
	failed := map[string]bool{}
	var msgs []string
	for _, p := range problems {
		failed[p.Check] = true
		msgs = append(msgs, p.Message)
		log.Error(nil, "The CSIDriver object does not fit the driver", logkeys.CSIDriver, name, logkeys.Check, p.Check, logkeys.Fix, p.Message)
	}
	for _, c := range csiDriverChecks {
		if obj == nil && c != CheckCSIDriverExists {
			continue // nothing to check
		}
		d.metrics.CSIDriverChecked(c, failed[c])
	}
	if len(problems) == 0 {
		log.Info("The CSIDriver object fits the driver", logkeys.CSIDriver, name)
		return
	}
	if sink, ok := d.opts.Observability.Events.(CSIDriverEventSink); ok {
		ref := api.CSIDriver{Name: name}
		if obj != nil {
			ref.UID = obj.UID
		}
		sink.CSIDriverEvent(ref, EventTypeWarning, ReasonCSIDriverMisconfigured, strings.Join(msgs, "; "))
	}
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
