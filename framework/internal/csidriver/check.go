package csidriver

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
)

// The checks, as the check label of the ephemera_csidriver_misconfigured
// metric names them (framework's CheckCSIDriver constants).
const (
	Exists         = "exists"
	Ephemeral      = "volumeLifecycleModes"
	PodInfoOnMount = "podInfoOnMount"
	FSGroupPolicy  = "fsGroupPolicy"
	AttachRequired = "attachRequired"
)

// Checks are every check, in the order problems are reported.
var Checks = []string{Exists, Ephemeral, PodInfoOnMount, FSGroupPolicy, AttachRequired}

// Problem is one way a CSIDriver object does not fit the driver
// (framework.CSIDriverProblem).
type Problem struct {
	Check   string // one of Checks
	Message string // what is wrong and what to change
}

// fsGroupPolicyFile is the fsGroupPolicy the framework is written for: it
// advertises VOLUME_MOUNT_GROUP, so with File the kubelet hands it the pod's
// fsGroup and does not walk the volume; with None the kubelet passes no
// fsGroup at all, and with ReadWriteOnceWithFSType only for a volume with a
// csi.fsType.
const fsGroupPolicyFile = "File"

// Check compares the driver's CSIDriver object with what the framework
// needs of it; obj nil means that there is none. It returns the problems
// found, none for a fitting object.
func Check(name string, obj *api.CSIDriver) []Problem {
	if obj == nil {
		return []Problem{{Exists, fmt.Sprintf(
			"there is no CSIDriver object %q: the kubelet refuses every inline volume of this driver (\"volume mode \\\"Ephemeral\\\" not supported\"); apply the driver's manifests (they contain it), with metadata.name equal to the driver name", name)}}
	}
	var p []Problem
	if !slices.Contains(obj.VolumeLifecycleModes, "Ephemeral") {
		p = append(p, Problem{Ephemeral, fmt.Sprintf(
			"CSIDriver %s: spec.volumeLifecycleModes %s must include Ephemeral, or the kubelet refuses the driver's inline volumes", name, listOrUnset(obj.VolumeLifecycleModes, "unset, which means [Persistent]"))})
	}
	if obj.PodInfoOnMount == nil || !*obj.PodInfoOnMount {
		p = append(p, Problem{PodInfoOnMount, fmt.Sprintf(
			"CSIDriver %s: spec.podInfoOnMount must be true: without the pod's identity every publish is refused", name)})
	}
	if obj.FSGroupPolicy != nil && *obj.FSGroupPolicy != fsGroupPolicyFile {
		p = append(p, Problem{FSGroupPolicy, fmt.Sprintf(
			"CSIDriver %s: spec.fsGroupPolicy is %s, want File: the driver applies the pod's fsGroup itself (VOLUME_MOUNT_GROUP), which the kubelet does only with File (None: pods with an fsGroup cannot write to their volume)", name, *obj.FSGroupPolicy)})
	} else if obj.FSGroupPolicy == nil {
		p = append(p, Problem{FSGroupPolicy, fmt.Sprintf(
			"CSIDriver %s: spec.fsGroupPolicy is unset (ReadWriteOnceWithFSType), want File: the kubelet then passes the pod's fsGroup only for volumes with a csi.fsType", name)})
	}
	if obj.AttachRequired == nil || *obj.AttachRequired {
		p = append(p, Problem{AttachRequired, fmt.Sprintf(
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
