// Package capacity accounts what a node's volumes hold against the driver's
// limits: the volume count (Options.Limits.MaxVolumesPerNode, per pod
// MaxVolumesPerPod) and the bytes of each backend (Options.Limits.Capacity).
// Its core type is Capacity. It is a leaf of the lifecycle: it knows records
// and nothing of the events that reserve and release.
package capacity
