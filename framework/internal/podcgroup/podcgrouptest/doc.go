// Package podcgrouptest lays out a fake kubelet's pod cgroups on this
// machine's cgroup v1 memory hierarchy, for tests that write content from a
// pod's cgroup for real (internal/podcgroup's writer is the test binary): a
// Root is a kubelet cgroup root of the test's own, removed when it ends, and
// Root.Pod makes a pod's memory cgroup below it. Linux only.
package podcgrouptest
