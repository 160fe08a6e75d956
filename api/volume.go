package api

import (
	"crypto/sha256"
	"encoding/hex"
)

// Well-known volume_context keys set by the kubelet. The kubelet only adds the pod
// keys and KeyEphemeral when the CSIDriver object has podInfoOnMount: true, and
// then they overwrite user-supplied attributes of the same name.
const (
	KeyPodName            = "csi.storage.k8s.io/pod.name"
	KeyPodNamespace       = "csi.storage.k8s.io/pod.namespace"
	KeyPodUID             = "csi.storage.k8s.io/pod.uid"
	KeyServiceAccountName = "csi.storage.k8s.io/serviceAccount.name"
	KeyEphemeral          = "csi.storage.k8s.io/ephemeral"
	// KeyServiceAccountTokens carries the tokens of CSIDriver.spec.tokenRequests as
	// JSON; since Kubernetes 1.35 it may arrive in secrets instead of volume_context.
	KeyServiceAccountTokens = "csi.storage.k8s.io/serviceAccount.tokens"

	// ReservedPrefix is the prefix of every kubelet-owned key; user attributes
	// must not use it.
	ReservedPrefix = "csi.storage.k8s.io/"
)

// Standard attributes understood by the framework itself.
const (
	// ParamSize is the volume size as a Kubernetes quantity ("64Mi", "1Gi").
	ParamSize = "size"
	// ParamBackend selects one of the driver's backends by name.
	ParamBackend = "backend"
)

// Pod identifies the pod a volume belongs to.
type Pod struct {
	Namespace      string `json:"namespace"`
	Name           string `json:"name"`
	UID            string `json:"uid"`
	ServiceAccount string `json:"serviceAccount,omitempty"`
}

// Volume is the typed view of one ephemeral inline volume that backends and content
// providers receive. Everything except Secrets and Tokens is persisted by the framework and
// handed back unchanged at teardown (when the kubelet sends only the volume ID and
// target path), so a backend can find and delete what it created.
type Volume struct {
	// ID is the CSI volume handle: "csi-" + hex(sha256(podUID + Name)).
	ID string
	// Name is the volume's name in the pod spec.
	Name string
	// TargetPath is where the volume is published for the pod.
	TargetPath string
	// Pod owns the volume.
	Pod Pod
	// Backend is the name of the backend that provides the storage.
	Backend string
	// ReadOnly is the pod's readOnly setting for the volume.
	ReadOnly bool
	// FSType is the fsType of the pod's volume source ("" when unset).
	FSType string
	// FSGroup is the pod's fsGroup when the kubelet passed it (VOLUME_MOUNT_GROUP).
	FSGroup *int64
	// Size is the requested size in bytes (the "size" attribute, or the backend's
	// default); 0 when unset.
	Size int64
	// Params are the user's volumeAttributes without kubelet-owned keys, the
	// framework's ("size", "backend") and the driver's declared ones
	// (framework.Options.Volumes.AcceptedAttributes): what is left for the backend.
	Params Params
	// Attributes are the driver's declared attributes, parsed, with their
	// defaults (framework.Options.Volumes.AcceptedAttributes); nil when it declares none.
	Attributes Values
	// Secrets are the contents of nodePublishSecretRef. They are only set while a
	// publish or refresh is in progress, are never persisted and never logged.
	Secrets Secrets
	// Tokens are the pod's service-account tokens from CSIDriver.spec.tokenRequests
	// (audience → token), read from secrets first and volume_context second.
	// Like Secrets they are in memory only and never logged.
	Tokens Tokens
	// State is backend-owned data the backend needs at teardown (a backing file,
	// a device). The backend may set it in Create; it is persisted with the volume.
	State map[string]string
}

// MarshalLog implements logr.Marshaler: a volume logs as its identity only.
func (v *Volume) MarshalLog() any {
	if v == nil {
		return nil
	}
	return struct {
		ID      string `json:"id"`
		Pod     string `json:"pod"`
		Backend string `json:"backend"`
	}{v.ID, v.Pod.Namespace + "/" + v.Pod.Name, v.Backend}
}

// VolumeHandle returns the volume handle the kubelet uses for an inline volume:
// "csi-" followed by the lowercase hex sha256 of podUID immediately followed by the
// pod-spec volume name (pkg/volume/csi makeVolumeHandle).
func VolumeHandle(podUID, volumeName string) string {
	sum := sha256.Sum256([]byte(podUID + volumeName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// Secrets holds the nodePublishSecretRef data. It prints, logs and marshals as a
// redacted list of keys so that values cannot leak by accident.
type Secrets map[string]string

// String implements fmt.Stringer without revealing values.
func (s Secrets) String() string { return redacted(len(s)) }

// GoString implements fmt.GoStringer without revealing values.
func (s Secrets) GoString() string { return redacted(len(s)) }

// MarshalLog implements logr.Marshaler without revealing values.
func (s Secrets) MarshalLog() any { return redacted(len(s)) }

// MarshalJSON never reveals values.
func (s Secrets) MarshalJSON() ([]byte, error) {
	return []byte(`"` + redacted(len(s)) + `"`), nil
}

func redacted(n int) string {
	if n == 0 {
		return "{}"
	}
	return "{***REDACTED***}"
}
