// Package crash holds crash-safety tests for the Ephemera framework (docs/design.md,
// "Lifecycle" and docs/security.md): a scratch driver built with the "failpoints" tag is killed with
// SIGKILL at every side-effect boundary of NodePublishVolume and
// NodeUnpublishVolume, restarted on the same state directory, and driven by the
// kubelet simulator of framework/drivertest until the volume is gone. The tests
// then assert that no mount, directory, state record or backend storage leaked
// and that no target was ever mounted twice.
//
// The tests need root (real tmpfs and bind mounts) and Linux; as anyone else
// they skip:
//
//	sudo go test ./test/crash/
package crash
