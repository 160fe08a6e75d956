package api

// CSIDriver is what a driver checks of its CSIDriver object
// (storage.k8s.io/v1), the cluster-scoped object that tells the kubelet how to
// call the driver. Pointer fields are nil when the object leaves them unset
// (the API server then applies its defaults: attachRequired true,
// podInfoOnMount false, volumeLifecycleModes [Persistent], fsGroupPolicy
// ReadWriteOnceWithFSType).
type CSIDriver struct {
	Name string
	// UID is the object's UID, for events about it.
	UID                  string
	AttachRequired       *bool
	PodInfoOnMount       *bool
	VolumeLifecycleModes []string
	FSGroupPolicy        *string
	RequiresRepublish    *bool
}
