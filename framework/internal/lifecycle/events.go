package lifecycle

import (
	"fmt"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// event sends an event about pod to Options.Observability.Events, if set.
func (d *Engine) event(pod api.Pod, eventType, reason, message string) {
	if d.cfg.Observability.Events == nil || pod.Name == "" || pod.Namespace == "" {
		return
	}
	d.cfg.Observability.Events.Event(pod, eventType, reason, message)
}

// refreshed counts a content refresh of a live volume and reports a failure to
// the pod's events.
func (d *Engine) refreshed(v *api.Volume, err error) {
	d.metrics.Refreshed(err)
	if err != nil {
		d.event(v.Pod, EventTypeWarning, ReasonRefreshFailed,
			fmt.Sprintf("volume %q keeps its last good content; refresh failed: %v", v.Name, err))
	}
}

// gcObserved is the orphan GC's single reporting call, once per volume and
// pass: it counts result in ephemera_gc_total{result} (a fixed label value such
// as "removed", "failed", "pending"; never a volume or pod name), and for
// metrics.GCRemoved emits a Normal OrphanRemoved event on the volume's pod.
func (d *Engine) gcObserved(rec *store.Record, result string) {
	d.metrics.GC(result)
	if result == metrics.GCRemoved && rec != nil {
		d.event(rec.Pod, EventTypeNormal, ReasonOrphanRemoved,
			fmt.Sprintf("removed volume %q left behind by the deleted pod (uid %s)", rec.VolumeName, rec.Pod.UID))
	}
}
