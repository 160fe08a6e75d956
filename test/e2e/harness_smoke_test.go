//go:build e2e && linux

package e2e

import (
	"testing"
	"time"
)

// TestHarnessEmptyDir proves the harness itself: a pod with a memory emptyDir runs,
// its container writes and reads back a file, and deletion removes the pod.
func TestHarnessEmptyDir(t *testing.T) {
	c := clu
	vol := memoryEmptyDir("data")
	p := c.createPod(t, c.newPod("default", "smoke-emptydir", vol, steps(
		st("write", "/data/f", "4096"), st("read", "/data/f"), st("pause"))))
	defer c.deletePod(t, p, 60*time.Second)
	c.waitRunning(t, p, 60*time.Second)
	out := c.output(t, p, 2)
	wantStep(t, out, 0, "write ok", "size=4096")
	wantStep(t, out, 1, "read ok", "size=4096")
	host := c.hostVolumePath(p, vol)
	if ms := mountsAt(host); len(ms) != 1 || ms[0].FSType != "tmpfs" {
		t.Errorf("emptyDir medium Memory at %s: want one tmpfs mount, got %+v", host, ms)
	}
	ex := c.exec(t, p, "read", "/data/f")
	wantStep(t, ex, 0, "read ok", "size=4096")
}
