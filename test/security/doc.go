// Package security holds the tests that prove Ephemera's safety guarantees
// against a hostile or unlucky node: lost and damaged state, symbolic links
// and renames raced into the kubelet's directories, a replaced pods directory,
// hostile sizes and colliding volume handles, and a seeded random walk over
// all of them (the model test). docs/security.md lists each guarantee beside
// the test that proves it.
//
// The bulkhead tests (issue 32: bulkhead_test.go, neighbours_test.go) prove
// that a plugin that is up but misbehaves cannot take the rest of a node's
// volume operations down. They run the scratch driver binary (built by the
// test, or EPHEMERA_SECURITY_DRIVER_BIN) and hostile plugins
// (test/internal/hostile, this test binary re-executed) as processes of
// their own, this process the kubelet (drivertest.Kubelet, retrying on
// drivertest.KubeletBackoff), with the driver's timeouts and the kubelet's
// schedule scaled alike by 1/15; they look only at the driver's gRPC codes,
// the mount table and the files. TestNoisyNeighbours measures latencies and
// runs outside -race, in `make test-model`.
//
// TestTenantActions (issue 44, tenant_test.go) is the tenant property: the
// same driver in a memory cgroup limited as the manifests limit it, pods as
// processes in memory cgroups laid out as the kubelet's (tenant agents, this
// test binary re-executed: tenantagent_test.go) doing a seeded catalogue of
// things to their own volumes beside hostile plugins; it compares what the
// driver reports with what the kernel says (cgroup files, statfs), in both
// ways the driver charges content, and runs in `make test-model` too.
//
// The tests mount real filesystems and need Linux and root; they run in
// `make test` (and `make test-unit`) and are skipped elsewhere.
package security
