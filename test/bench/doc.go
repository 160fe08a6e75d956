// Package bench is a kubelet-shaped load generator for Ephemera: publish and
// unpublish latency through the real gRPC socket (drivertest's kubelet
// simulator, one connection per RPC, two NodeGetCapabilities per publish),
// with the real mounter and bbolt state, against the raw syscall floor of the
// same pattern measured in the same run. See README.md.
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestLatencyTable -v
//	go test ./test/bench -run '^$' -bench . -benchtime 400x
//
// TestPluginOverhead (plugin_test.go) runs the kubelet-shaped cycles against
// tmpfs volumes with content provided in process and by an out-of-process
// plugin (this test binary re-executed as a pluginserver), alternated:
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestPluginOverhead -v
//
// TestKubeletShapedProcess (process_test.go) runs the scratch binary and the
// stateless reference driver as processes of their own against a client that
// does only what the kubelet does per volume, alternated, and counts each
// driver's syscalls per cycle under strace -c:
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestKubeletShapedProcess -v
//
// TestDriverMemory (memory_test.go, make bench-memory) measures the scratch
// driver's resident memory as a subprocess, idle and with 1,000 published
// volumes:
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestDriverMemory -v
//
// TestDriverContentMemory (contentmem_test.go, make bench-memory) measures its
// peak RSS while a plugin answers bursts of publishes with the worst content
// answers the bounds allow:
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestDriverContentMemory -v
//
// TestDriverHeldMemory (heldmem_test.go, make bench-memory) runs it in a
// memory cgroup limited like the DaemonSet's container, with content held in
// tmpfs volumes, answers in flight and volume-stats walks at once, then
// restarts it in the same cgroup; the cgroup's peak must stay under the
// limit:
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestDriverHeldMemory -v
//
// The measurements are Linux-only (bench_test.go, contentmem_test.go,
// heldmem_test.go, load_test.go, memory_test.go, plugin_test.go,
// process_test.go) and need root.
package bench
