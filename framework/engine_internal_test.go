package framework

import (
	"slices"
	"testing"

	"github.com/ephemera-csi/ephemera/framework/internal/csidriver"
	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/daemon"
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/internal/lifecycle"
)

// The event types and reasons the engine posts are the ones the framework
// exports.
func TestEventNames(t *testing.T) {
	for ours, engine := range map[string]string{
		EventTypeNormal:        lifecycle.EventTypeNormal,
		EventTypeWarning:       lifecycle.EventTypeWarning,
		ReasonRefreshFailed:    lifecycle.ReasonRefreshFailed,
		ReasonOrphanRemoved:    lifecycle.ReasonOrphanRemoved,
		ReasonProvisioningSlow: lifecycle.ReasonProvisioningSlow,
	} {
		if ours != engine {
			t.Errorf("framework says %q, the engine posts %q", ours, engine)
		}
	}
}

// The options' "no content capacity" is the lanes' (engineConfig passes it on).
func TestNoContentCapacity(t *testing.T) {
	if NoContentCapacity != lanes.NoContentCapacity {
		t.Errorf("framework.NoContentCapacity %d, lanes.NoContentCapacity %d", NoContentCapacity, lanes.NoContentCapacity)
	}
}

// The options' other special values are those of the subsystems that check
// them (daemon.Config.Check, lifecycle.Config.Check, csiserver.Check).
func TestSpecialValues(t *testing.T) {
	for _, c := range []struct {
		what        string
		ours, their any
	}{
		{"StateRecoveryRebuild", StateRecoveryRebuild, daemon.RecoveryRebuild},
		{"StateRecoveryRefuse", StateRecoveryRefuse, daemon.RecoveryRefuse},
		{"NoMaxVolumesPerPod", NoMaxVolumesPerPod, lifecycle.NoMaxVolumesPerPod},
		{"NoMaxVolumeSize", NoMaxVolumeSize, int64(csiserver.NoMaxVolumeSize)},
	} {
		if c.ours != c.their {
			t.Errorf("framework.%s is %v, the check knows %v", c.what, c.ours, c.their)
		}
	}
}

// The checks of the CSIDriver object the framework exports are the ones
// its startup check exports as metric labels (internal/csidriver).
func TestCSIDriverCheckNames(t *testing.T) {
	ours := []string{CheckCSIDriverExists, CheckCSIDriverEphemeral, CheckCSIDriverPodInfoOnMount, CheckCSIDriverFSGroupPolicy, CheckCSIDriverAttachRequired}
	if !slices.Equal(ours, csidriver.Checks) {
		t.Errorf("framework's checks %q, internal/csidriver's %q", ours, csidriver.Checks)
	}
}
