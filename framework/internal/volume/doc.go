// Package volume owns the contract between the kubelet, the framework and a
// backend about one inline volume, so that the framework and its test kits
// (backendtest, drivertest) implement it once: the kubelet's directory layout
// and how a target path is parsed and checked against the volume handle, which
// attributes the framework consumes, and how a persisted record becomes the
// api.Volume a backend receives. [Target] is a target path as
// [ParseTarget] parsed it; [TargetPath] and [VolumeDir] build the kubelet's paths;
// [FromRecord] and [Orphan] build the api.Volume.
package volume
