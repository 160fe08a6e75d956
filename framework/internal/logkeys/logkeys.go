// Package logkeys holds the structured-logging keys used across Ephemera, in the
// lowerCamelCase style of the Kubernetes structured logging guide.
package logkeys

const (
	Method     = "method"
	VolumeID   = "volumeID"
	Pod        = "pod"
	PodUID     = "podUID"
	TargetPath = "targetPath"
	Backend    = "backend"
	Code       = "code"
	Duration   = "duration"
	Request    = "request"
	Path       = "path"
	Phase      = "phase"
	Endpoint   = "endpoint"
	Count      = "count"
)
