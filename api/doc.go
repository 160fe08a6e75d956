// Package api holds Ephemera's public, stable types: what a backend, a content
// provider and a plugin see of an ephemeral inline volume, and the errors they
// answer with.
//
// # Types
//
//   - [Volume] is the typed view of one volume a backend receives: its ID, its
//     [Pod], its size and its attributes, as [Params] and [Values].
//   - [Params] is the pod's volumeAttributes as a string map (the kubelet's
//     csi.storage.k8s.io/ keys removed). It has three readers (Has, String,
//     and Quantity, the one that checks its value) and [Params.Only], which
//     refuses undeclared keys; it validates nothing else. The checked, typed
//     view is declared with [Attribute] ([Attributes]: StringAttr, EnumAttr,
//     QuantityAttr, ModeAttr, ...), which the framework parses once per
//     publish into [Values].
//   - [Source] is what a backend hands the framework to publish: a directory,
//     a tmpfs or a block device; [File] is one file of a content provider.
//   - [Secrets] (the nodePublishSecretRef data) and [Tokens] (the service
//     account tokens the kubelet requested) print, log and marshal redacted.
//   - [VolumeList] and [VolumeInfo] are the driver's GET /volumes; [CSIDriver]
//     is what a driver checks of its CSIDriver object, and [ValidateDriverName]
//     the names such an object can have (framework.New and the scaffold,
//     cmd/ephemera, check with it).
//   - The Key constants are the kubelet's well-known volume_context keys, the
//     Param constants the framework's own attributes.
//
// # Errors
//
// The sentinel errors ([ErrInvalidParams], [ErrUnavailable], ...) are what a
// backend wraps; the framework maps each to one gRPC code.
//
// # Stability
//
// Types here change only in backward-compatible ways within a major version.
package api
