//go:build linux && !race

// Outside -race: the test measures latencies of the kubelet's side (this
// process) against a baseline, under the load of seven plugin processes and
// a driver; make test-model runs it (make test-unit, with -race, does not
// build it).

package security

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/test/internal/hostile"
)

// TestNoisyNeighbours (issue 32) is the noisy-neighbour property: plugins
// that misbehave in every way test/internal/hostile knows, all at once,
// leave the node's other volumes as they were without them.
//
// The driver (defaults but for the timeouts, scaled by 1/15 as the
// kubelet's retries are: --content-timeout=2s, --operation-timeout=6s) has
// its tmpfs, the plugin "healthy" and one hostile content plugin per mode,
// named after it: hang, trickle (its answers' bytes come at 256 KiB/s),
// flood (answers of its whole bound, every time), crash (dies
// mid-answer; restarted 0.67s later, a CrashLoopBackOff's first 10s
// scaled), late (answers just after the deadline) and flap (socket up 0.5s,
// down 0.5s). Every plugin's bound (max-content-bytes) is 4Mi, so that the
// default --content-bytes-in-flight, 48Mi, holds one answer of each of the
// seven, as the driver requires. Everything is kubelet-shaped: each volume on its own
// goroutine, retried on the kubelet's schedule (drivertest.KubeletBackoff).
//
// The control workload is pods of a tmpfs volume and a healthy volume, one
// started every 300ms, kept 500ms, then deleted. It runs first alone (12
// pods: the baseline), then (24 pods) under the hostile load, which has
// built up for 2s by then: pods of the hostile plugins that come and go
// (each published as the kubelet does until it is, kept 500ms, deleted,
// replaced by a new one), 3 at a time of 3 volumes per mode, and for flood
// 2 at a time of 1 volume.
//
// The load is smaller than the node's 64 operations in flight
// (TestHungContentPluginCannotBlockTheNode exceeds them with one plugin)
// because what an attempt costs is not scaled: a volume retried on the
// scaled schedule makes its calls 15 times as often as on a node, so 9
// volumes of a plugin make the calls of 135, and the retries of a hung
// plugin's volumes come in herds, on the same tick of the loop. On 2 cores,
// with --max-in-flight and --content-bytes-in-flight unlimited (what
// bulkheads at best achieve), 5 pods of 3 per mode made control publishes up
// to 100-170ms slower in one run of three, 3 pods of 3 at most 63ms in
// five; six 16Mi flood answers at once made them 100-300ms slower while they
// lasted (receiving and writing them costs CPU that no bulkhead of the
// driver's divides), two at once up to 60-85ms. With the bulkheads, a flood
// of 16Mi answers (the default bound; one in flight at a time, its share
// of the budget being 24Mi) still made the control publish p99 80-164ms
// against a baseline of 10-33ms in 9 runs, over the bound in 3: CPU is
// not partitioned (docs/security.md, "What is not promised"). At 4Mi it
// was 20-43ms in 5 runs, without flood 19-23ms in 4.
//
// Pass criteria, under the hostile load:
//
//   - every control volume published within 5s of its pod's start;
//   - at least 99% of the control attempts (publishes and unpublishes) OK;
//   - the control publish time (from a volume's first attempt to its
//     success, retries and their waits included) at the 99th percentile at
//     most max(2 × the baseline's 99th percentile, that + 100ms), the
//     baseline measured before the load and again after it (the slower);
//   - then every teardown, control and hostile, completes (within 20s), and
//     no mount, pod directory or plugin directory is left.
//
// It takes about 18s. Run it outside -race (it measures latencies).
func TestNoisyNeighbours(t *testing.T) {
	const floodBound = 4 << 20
	// Seven content plugins share the 48Mi budget, one answer of each
	// reserved: their bound is 4Mi (see above for flood's).
	specs := []pluginSpec{{name: healthyPlugin, mode: hostile.Healthy, maxBytes: floodBound}}
	for _, m := range hostile.ContentModes {
		s := pluginSpec{name: string(m), mode: m, maxBytes: floodBound}
		if m == hostile.Crash {
			s.restart = scaled(10 * time.Second)
		}
		specs = append(specs, s)
	}
	n := startProcNode(t, specs)
	ctx := n.ctx
	start := time.Now()
	const (
		every  = 300 * time.Millisecond
		hold   = 500 * time.Millisecond
		within = 5 * time.Second
	)

	// Warm up (each plugin's first handshake), then the baseline.
	n.oneByOne(ctx, n.newPods("warm", 2, controlVols), 0, within)
	mark := n.led.mark()
	n.controlLoad(ctx, n.newPods("base", 12, controlVols), every, hold, within)
	basePub := summarize(n.led.since(mark, "publish", nil))
	baseAll := summarize(append(n.led.since(mark, "publish", nil), n.led.since(mark, "unpublish", nil)...))
	if basePub.done != basePub.volumes || baseAll.okShare() < 1 {
		t.Fatalf("baseline, alone on the node: publishes %v; all attempts %v", basePub, baseAll)
	}
	baseline := basePub.pct(99)

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	peak := n.samplePeak(loadCtx, func() int { return len(n.mounts(n.root)) })
	var churns []func() []podVols
	for _, m := range hostile.ContentModes {
		slots, vols, size := 3, 3, "1Mi"
		if m == hostile.Flood {
			slots, vols, size = 2, 1, "8Mi" // a 4Mi answer, written: see above
		}
		churns = append(churns, n.churn(loadCtx, string(m), slots, volsOf(vols, string(m), size), hold))
	}
	time.Sleep(2 * time.Second) // the hostile load builds up

	mark = n.led.mark()
	control := n.newPods("control", 24, controlVols)
	n.controlLoad(ctx, control, every, hold, within)
	ctlPub := summarize(n.led.since(mark, "publish", inGroups("tmpfs", healthyPlugin)))
	ctlAll := summarize(append(n.led.since(mark, "publish", inGroups("tmpfs", healthyPlugin)), n.led.since(mark, "unpublish", inGroups("tmpfs", healthyPlugin))...))
	hostilePeak := peak()
	stopLoad()
	var hostilePods []podVols
	for _, wait := range churns {
		hostilePods = append(hostilePods, wait()...)
	}

	t.Logf("baseline (control alone): publishes %v", basePub)
	t.Logf("under the hostile load, at most %d volumes mounted at once on the node:", hostilePeak)
	for _, g := range []string{"tmpfs", healthyPlugin} {
		t.Logf("control %s publishes: %v", g, summarize(n.led.since(mark, "publish", inGroups(g))))
		t.Logf("control %s unpublishes: %v", g, summarize(n.led.since(mark, "unpublish", inGroups(g))))
	}
	t.Logf("control, all: %d attempts, %.2f%% OK; publish time p99 %v",
		ctlAll.attempts, 100*ctlAll.okShare(), ctlPub.pct(99).Round(time.Millisecond))
	for _, m := range hostile.ContentModes {
		t.Logf("hostile %s publishes: %v", m, summarize(n.led.since(0, "publish", inGroups(string(m)))))
	}
	t.Logf("the crash plugin was started %d times", n.plugins[string(hostile.Crash)].Starts())

	if ctlPub.done != ctlPub.volumes || ctlPub.volumes != 2*len(control) {
		var late []string
		for _, r := range n.led.since(mark, "publish", inGroups("tmpfs", healthyPlugin)) {
			if r.err != nil {
				late = append(late, r.pod+"/"+r.vol)
			}
		}
		slices.Sort(late)
		t.Errorf("%d of %d control volumes published within %v; want all %d (not: %s)", ctlPub.done, ctlPub.volumes, within, 2*len(control), strings.Join(late, ", "))
	}
	if ctlAll.okShare() < 0.99 {
		t.Errorf("%.2f%% of the control attempts OK (%d of %d); want at least 99%%", 100*ctlAll.okShare(), ctlAll.ok, ctlAll.attempts)
	}

	// Every teardown completes: the hostile pods' and any control pod's
	// left by a failure above.
	teardown := time.Now()
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var hostileErr, controlErr error
	wg.Go(func() { hostileErr = n.deleteAll(tctx, hostilePods) })
	wg.Go(func() { controlErr = n.deleteAll(tctx, control) })
	wg.Wait()
	if hostileErr != nil {
		t.Errorf("teardown of the hostile pods: %v", hostileErr)
	}
	if controlErr != nil {
		t.Errorf("teardown of the control pods: %v", controlErr)
	}
	tookTeardown := time.Since(teardown)

	// The baseline again, the hostile pods gone: the slower of the two
	// counts, so that a machine busier now than at the start (other tests,
	// other builds) does not read as the neighbours' doing; a publish that
	// waits on a neighbour stays far over either bound.
	mark = n.led.mark()
	n.controlLoad(ctx, n.newPods("after", 12, controlVols), every, hold, within)
	afterPub := summarize(n.led.since(mark, "publish", nil))
	if afterPub.done != afterPub.volumes {
		t.Errorf("baseline again, the hostile pods gone: publishes %v", afterPub)
	}
	baseline = max(baseline, afterPub.pct(99))
	limit := bound(baseline)
	t.Logf("baseline again (control alone, the hostile pods gone): publishes %v; the slower p99 %v, so the bound is %v", afterPub, baseline.Round(time.Millisecond), limit.Round(time.Millisecond))
	if p99 := ctlPub.pct(99); len(ctlPub.took) == 0 || p99 > limit {
		t.Errorf("control publish time p99 %v under the hostile load, over the bound of %v (baseline p99 %v)", p99.Round(time.Millisecond), limit.Round(time.Millisecond), baseline.Round(time.Millisecond))
	}
	n.wantClean()
	t.Logf("teardown %v; took %v", tookTeardown.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
