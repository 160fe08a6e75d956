// Package drivertest helps driver authors test ephemeral inline CSI node drivers
// without a cluster.
//
// # Kubelet simulator
//
// [Kubelet] talks to a driver's CSI endpoint exactly as the kubelet's
// pkg/volume/csi does for ephemeral inline volumes, and lays out the kubelet
// root directory the same way, so a driver under test sees real requests on
// real paths:
//
//   - [Kubelet.Publish] runs the SetUpAt sequence: create the parent of the
//     target path (never the target), NodeGetCapabilities (VOLUME_MOUNT_GROUP),
//     write vol_data.json, NodeGetCapabilities (access mode), NodePublishVolume.
//     The request is the one [Kubelet.PublishRequest] builds: volume_id is
//     api.VolumeHandle(podUID, volumeName), pod-info keys overwrite user
//     attributes when podInfoOnMount is on, secrets is never nil.
//   - Every RPC uses a new gRPC connection (authority "localhost") that is closed
//     afterwards, and each operation is bounded by the kubelet's 2 minute
//     timeout.
//   - Errors are classified like the kubelet's isFinalError ([IsFinal]): after a
//     final error the kubelet removes the volume directory and forgets the
//     volume; after a non-final one (Canceled, DeadlineExceeded, Unavailable,
//     ResourceExhausted, Aborted, non-gRPC) the volume stays "uncertain" and is
//     published again after [Kubelet.Restart] or unpublished when the pod goes.
//   - [Kubelet.Unpublish] and [Kubelet.DeletePod] send NodeUnpublishVolume with
//     only volume_id and target_path, then clean up like removeMountDir: a target
//     that is still a mount point is left alone, a non-empty one is an error.
//   - [Kubelet.Restart] rebuilds state from the vol_data.json files on disk, then
//     republishes volumes of pods that still exist and unpublishes the others
//     ([Kubelet.DeletePodOffline] deletes a pod while the kubelet is "down").
//   - [Kubelet.Republish] models CSIDriver requiresRepublish.
//   - [Kubelet.OrphanPod] makes a pod's directory vanish without any RPC, for
//     testing a driver's garbage collection.
//   - [Kubelet.Calls] and [Kubelet.CapabilityCalls] expose the RPC log.
//
// Publishes are not retried on their own: tests drive every operation and
// assert on the returned gRPC errors (status.Code) and on [Kubelet.State].
// Teardowns ([Kubelet.Unpublish], [Kubelet.DeletePod], [Kubelet.Restart]'s
// unpublishes) retry an answer of Aborted or Unavailable on the kubelet's
// schedule ([KubeletOptions.Retry]), as the kubelet keeps tearing a deleted
// pod down: a refresh that still holds the volume, or a driver that
// restarts, does not fail the test. A test that checks such a first answer
// sets Backoff{Attempts: 1} ([Kubelet.SetRetry]). DeletePod unpublishes a
// pod's volumes in parallel, as the kubelet does. It is safe for concurrent
// use.
//
// # Retries
//
// A test that wants the kubelet's retries runs an operation through
// [Backoff.Retry]: after each failure the volume waits 500ms, doubling up to
// 2m2s, and its retry starts on the next 100ms tick of the reconciler's loop,
// each attempt bounded by the 2 minute CSI deadline. [KubeletBackoff] scales
// that schedule, so that a test whose driver has scaled timeouts keeps the
// kubelet's shape, and Retry records every attempt (start, latency, code):
//
//	b := drivertest.KubeletBackoff(2.0 / 30) // a content timeout of 2s, not 30s
//	attempts, err := b.Retry(ctx, func(ctx context.Context) error {
//		return k.Publish(ctx, pod, vol)
//	})
//
// A typical test starts the driver in-process with [Start], which serves it on
// a unix socket, points a Kubelet at that endpoint and the same root directory,
// and publishes pods:
//
//	k := drivertest.NewKubelet(drivertest.KubeletOptions{
//		Root: root, Endpoint: endpoint, DriverName: "example.csi.io",
//	})
//	pod := k.NewPod("default", "web")
//	err := k.Publish(ctx, pod, drivertest.InlineVolume{
//		Name:       "data",
//		Attributes: map[string]string{"size": "64Mi"},
//	})
//	// ... inspect k.TargetPath(pod, "data") ...
//	err = k.DeletePod(ctx, pod)
//
// [Start] does the same for a driver built from framework.Options and sends
// the driver's log to t.Log unless Options.Observability.Logger is set. At the end of a
// test, [Harness.RequireClean] checks that nothing was left behind: no mount,
// target or pod directory below the kubelet root, no record in the driver's
// state, no backend storage without a record.
//
// # Tests without root
//
// A driver's tests run without root with the fake mounter and the in-memory
// store in the options given to [Start]:
//
//	h := drivertest.Start(t, framework.Options{
//		Backends: map[string]framework.Backend{"dir": dirBackend},
//		Mounter:  mount.NewFake(),  // framework/mount
//		Store:    memstore.New(),   // framework/store/memstore
//	})
//
// The Fake keeps targets and mounts in memory; Start tells it about the
// directories the Kubelet creates, so [Kubelet.Publish], [Kubelet.Restart] and
// [Kubelet.DeletePod] run their whole sequence, and a test can check the
// driver's answers, the Kubelet's State, the records and the backends'
// storage, and end with [Harness.RequireClean]. The backends are real: tmpfs
// and dir need no root (the framework mounts what they return, here into the
// Fake); a backend that needs root itself (loop attaches a device) still does.
//
// Such a test cannot prove:
//
//   - real mounts: that anything is mounted, read-only or with the right
//     options, that a republish does not stack a second mount, that a busy
//     target unmounts. The Fake models the framework's Linux mounter, not the
//     kernel;
//   - size limits: a tmpfs or loop volume filling up at its size;
//   - content and fsGroup: nothing exists at a target on disk, so a driver
//     with a ContentProvider, or a pod with an fsGroup, fails to publish
//     (Unavailable: the target cannot be opened). Test a ContentProvider by
//     calling it, and the published files with root;
//   - symlink safety: the Fake refuses only the links a test adds with
//     AddSymlink; a pod directory swapped for a link is caught by the real
//     mounter only (test/security);
//   - crash safety: the in-memory store survives [Harness.RestartDriver] because the
//     same Store is reused, but not a process exit; durability, torn state and
//     a kill -9 between side effects need the bbolt store and a real process
//     (test/crash).
package drivertest

// Where things are:
//
//   - start.go: Start and the Harness (a driver in-process, its clients and a
//     Kubelet pointed at it); clean.go: Harness.RequireClean.
//   - kubelet.go: the Kubelet type, its options, pods, volumes and states, the
//     root directory layout and the accessors (paths, State, Calls).
//   - publish.go: the SetUp sequence (PublishRequest, Publish, Republish) and
//     IsFinal.
//   - unpublish.go: the TearDown side (Unpublish, DeletePod, DeletePodOffline,
//     OrphanPod) and the kubelet's directory cleanup.
//   - restart.go: Restart, the reconstruction from vol_data.json.
//   - voldata.go: reading and writing vol_data.json.
//   - dial.go: one gRPC connection per RPC, as the kubelet dials the plugin.
//   - backoff.go: the kubelet's retry schedule (Backoff) and Retry.
//   - mounts_linux.go, mounts_other.go: mount point detection (mountinfo on
//     Linux, links elsewhere); mounts.go: removing a tree around mount points.
//   - uuid.go: pod UIDs.
