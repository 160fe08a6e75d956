// Package backendtest is the conformance suite every [framework.Backend] runs,
// built-in or a driver author's, in the spirit of testing/fstest and
// storetest. It checks the contract the framework relies on, with the volumes
// the framework would pass:
//
//   - Validate (the backend's declared attributes, a
//     [framework.AttributeDeclarer], and its [framework.Validator], checked as
//     a publish checks them: [framework.ValidateVolume]) accepts
//     Options.Params, refuses an unknown attribute with an error wrapping
//     api.ErrInvalidParams that names it, and creates nothing;
//   - Create is idempotent: a second Create of the same volume (with the State
//     the first one recorded, as on a retry or repair) returns an equal Source,
//     and does not disturb the volume while it is mounted;
//   - Delete is nil for a volume never created and for one already deleted, and
//     frees storage given only the volume ID and backend name, which is all the
//     startup reconcile knows of storage without a record; a volume created
//     again after Delete is empty;
//   - the size is enforced: Options.Size/2 bytes fit, Options.Size + 1MiB fail
//     with ENOSPC or EDQUOT;
//   - List (a [framework.Lister]) holds exactly the volumes created and not
//     deleted; a driver started with a new state file over storage without a
//     record keeps it (it cannot prove it a leftover), and for a
//     [framework.Stamper] a driver restarted on the state that stamped the
//     storage area deletes storage created without a record meanwhile;
//   - Check (a [framework.HealthChecker]) is nil for a created volume and an
//     error once it is deleted;
//   - 16 goroutines create and delete distinct volumes at once (run with -race);
//   - a pod's volume with Options.Params publishes and unpublishes through a
//     real driver ([drivertest.Start] and its kubelet simulator).
//
// With Options.Mount, the Sources a backend returns are mounted as the
// framework mounts them (mount.New(), nosuid and nodev, on a target below a
// temporary kubelet root), exactly one mount must appear at the target, and its
// filesystem type must be Options.FSType (or the Source's FSType) in
// /proc/self/mountinfo. Mounting needs Linux and root; without them those
// subtests are skipped, not failed. Every subtest unmounts what it mounted and
// deletes what it created, even when it fails, and reports any mount it finds
// left below its directories.
//
// Volumes are built like the framework builds them from a NodePublishVolume
// request: ID is api.VolumeHandle(podUID, name), the pod has a random UID,
// "size" in Options.Params becomes Volume.Size, "backend" names the backend
// (default "backendtest"), and both are removed from Volume.Params. Validate,
// when the backend has it, runs before every Create, and may fill in defaults.
//
// # Usage
//
// In a _test.go file of the backend's package:
//
//	func TestBackendConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T) framework.Backend {
//			return mybackend.New(mybackend.Options{Root: t.TempDir()})
//		}, backendtest.Options{
//			Params: map[string]string{"size": "16Mi"},
//			Size:   16 << 20, // 0 if the backend does not enforce sizes
//			FSType: "ext4",   // the filesystem mounted from the Source, "" for any
//			Mount:  true,     // needs root; skipped otherwise
//		})
//	}
//
// newBackend is called once per subtest and must return a backend without
// volumes: keep its storage (root directory, backing files) in t.TempDir(), and
// release anything global (loop devices) in Delete, which the suite calls for
// every volume it created.
package backendtest
