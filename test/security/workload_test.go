//go:build linux

package security

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// Kubelet-shaped workloads of the bulkhead tests, and the ledger of their
// attempts.

// vol is an inline volume of backend (a plugin's name, or tmpfs), sized
// size (none for a plugin that creates directories).
func vol(name, backend, size string) drivertest.InlineVolume {
	a := map[string]string{api.ParamBackend: backend}
	if size != "" {
		a[api.ParamSize] = size
	}
	return drivertest.InlineVolume{Name: name, Attributes: a}
}

// group is the name under which a volume's operations are counted: its
// backend.
func group(v drivertest.InlineVolume) string { return v.Attributes[api.ParamBackend] }

// publishPod publishes the volumes of pod as the kubelet does: each on its
// own goroutine, retried on the kubelet's schedule until it is published or
// ctx ends. It records every attempt and returns the errors of the volumes
// that were not published.
func (n *procNode) publishPod(ctx context.Context, pod *drivertest.Pod, vols []drivertest.InlineVolume) error {
	errs := make([]error, len(vols))
	var wg sync.WaitGroup
	for i, v := range vols {
		wg.Go(func() {
			attempts, err := kubeletBackoff.Retry(ctx, func(ctx context.Context) error { return n.k.Publish(ctx, pod, v) })
			n.led.add(pod, v, "publish", attempts, err)
			if err != nil {
				errs[i] = fmt.Errorf("%s/%s volume %s: %w", pod.Namespace, pod.Name, v.Name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// deletePod tears pod down as the kubelet does once it is deleted: each
// volume unpublished on its own goroutine, retried on the kubelet's
// schedule until it is unpublished or ctx ends, then the pod's directories
// removed. It records every attempt. A volume that is not published is not
// sent anything (Kubelet.Unpublish).
func (n *procNode) deletePod(ctx context.Context, pod *drivertest.Pod, vols []drivertest.InlineVolume) error {
	errs := make([]error, len(vols)+1)
	var wg sync.WaitGroup
	for i, v := range vols {
		if n.k.State(pod, v.Name) == drivertest.StateNone {
			continue
		}
		wg.Go(func() {
			attempts, err := kubeletBackoff.Retry(ctx, func(ctx context.Context) error { return n.k.Unpublish(ctx, pod, v.Name) })
			n.led.add(pod, v, "unpublish", attempts, err)
			if err != nil {
				errs[i] = fmt.Errorf("%s/%s volume %s: %w", pod.Namespace, pod.Name, v.Name, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err := kubeletBackoff.Retry(ctx, func(ctx context.Context) error { return n.k.DeletePod(ctx, pod) })
	return err
}

// podVols is a pod and its volumes.
type podVols struct {
	pod  *drivertest.Pod
	vols []drivertest.InlineVolume
}

// newPods makes count pods named prefix-i, each with vols(i).
func (n *procNode) newPods(prefix string, count int, vols func(i int) []drivertest.InlineVolume) []podVols {
	out := make([]podVols, count)
	for i := range out {
		out[i] = podVols{pod: n.k.NewPod("bulkhead", prefix+"-"+strconv.Itoa(i)), vols: vols(i)}
	}
	return out
}

// controlVols are a control pod's volumes: a tmpfs and one of the healthy
// plugin.
func controlVols(int) []drivertest.InlineVolume {
	return []drivertest.InlineVolume{vol("scratch", "tmpfs", "1Mi"), vol("token", healthyPlugin, "1Mi")}
}

// volsOf returns a function giving count volumes of backend.
func volsOf(count int, backend, size string) func(int) []drivertest.InlineVolume {
	return func(int) []drivertest.InlineVolume {
		vs := make([]drivertest.InlineVolume, count)
		for i := range vs {
			vs[i] = vol("v"+strconv.Itoa(i), backend, size)
		}
		return vs
	}
}

// startStorm publishes the pods as the kubelet does (publishPod) on the
// node's goroutines until ctx ends; wait waits for them.
func (n *procNode) startStorm(ctx context.Context, pods []podVols) (wait func()) {
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Add(1)
		n.goRun(func() {
			defer wg.Done()
			_ = n.publishPod(ctx, p.pod, p.vols)
		})
	}
	return wg.Wait
}

// churn runs slots pods of vols(i) named prefix-slot-generation, as a
// workload whose pods come and go does: each slot publishes a new pod as the
// kubelet does (retried until it is published or ctx ends), keeps it for
// hold, deletes it (retried) and starts over, until ctx ends. wait waits for
// the slots and returns the pods they left (published, or being published,
// when ctx ended), for a teardown.
func (n *procNode) churn(ctx context.Context, prefix string, slots int, vols func(int) []drivertest.InlineVolume, hold time.Duration) (wait func() []podVols) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		left []podVols
	)
	for slot := range slots {
		wg.Add(1)
		n.goRun(func() {
			defer wg.Done()
			for gen := 0; ; gen++ {
				p := podVols{pod: n.k.NewPod("bulkhead", fmt.Sprintf("%s-%d-%d", prefix, slot, gen)), vols: vols(slot)}
				err := n.publishPod(ctx, p.pod, p.vols)
				if err == nil && sleepCtx(ctx, hold) {
					err = n.deletePod(ctx, p.pod, p.vols)
				}
				if err != nil || ctx.Err() != nil {
					mu.Lock()
					left = append(left, p)
					mu.Unlock()
					return
				}
			}
		})
	}
	return func() []podVols {
		wg.Wait()
		return left
	}
}

// deleteAll deletes the pods (deletePod) at once and returns the errors.
func (n *procNode) deleteAll(ctx context.Context, pods []podVols) error {
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() { errs[i] = n.deletePod(ctx, p.pod, p.vols) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// controlLoad runs the pods, one started every apart (each on its own,
// whether the one before is done or not): each is published as the kubelet
// does (its volumes retried) for at most within, kept for hold, and deleted
// (retried, at most within). It returns when all are deleted or out of
// time; what happened is in the ledger.
func (n *procNode) controlLoad(ctx context.Context, pods []podVols, every, hold, within time.Duration) {
	staggered(ctx, len(pods), every, func(i int) {
		p := pods[i]
		pctx, cancel := context.WithTimeout(ctx, within)
		_ = n.publishPod(pctx, p.pod, p.vols)
		cancel()
		sleepCtx(ctx, hold)
		dctx, cancel := context.WithTimeout(ctx, within)
		_ = n.deletePod(dctx, p.pod, p.vols)
		cancel()
	})
}

// staggered calls f(0), ..., f(count-1), each on its own goroutine, one
// started every apart whether the one before is done or not, until ctx
// ends, and waits for those it started.
func staggered(ctx context.Context, count int, every time.Duration, f func(i int)) {
	var wg sync.WaitGroup
	start := time.Now()
	for i := range count {
		if !sleepCtx(ctx, time.Until(start.Add(time.Duration(i)*every))) {
			break
		}
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// oneByOne publishes each pod, deletes it, and waits gap before the next:
// one pod at a time, for a latency without concurrency of its own.
func (n *procNode) oneByOne(ctx context.Context, pods []podVols, gap, within time.Duration) {
	for _, p := range pods {
		pctx, cancel := context.WithTimeout(ctx, within)
		_ = n.publishPod(pctx, p.pod, p.vols)
		_ = n.deletePod(pctx, p.pod, p.vols)
		cancel()
		if !sleepCtx(ctx, gap) {
			return
		}
	}
}

// sleepCtx sleeps for d, or until ctx ends (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// staggeredDeletes deletes the pods, one started every apart (each on its
// own), each given at most within, and returns for each what went wrong:
// its deletion's error, or a mount or directory of the pod still there.
func (n *procNode) staggeredDeletes(ctx context.Context, pods []podVols, every, within time.Duration) []error {
	errs := make([]error, len(pods))
	staggered(ctx, len(pods), every, func(i int) {
		p := pods[i]
		dctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		err := n.deletePod(dctx, p.pod, p.vols)
		if err == nil {
			if ms := n.mounts(n.k.PodDir(p.pod)); len(ms) > 0 {
				err = fmt.Errorf("deleted, but %s is still mounted", ms[0].MountPoint)
			} else if _, serr := os.Stat(n.k.PodDir(p.pod)); serr == nil {
				err = fmt.Errorf("deleted, but its directory %s is still there", n.k.PodDir(p.pod))
			}
		}
		errs[i] = err
	})
	return errs
}

// samplePeak records the most count says, every 20ms until ctx ends; peak
// reads it.
func (n *procNode) samplePeak(ctx context.Context, count func() int) (peak func() int) {
	var (
		mu   sync.Mutex
		most int
	)
	n.goRun(func() {
		for ctx.Err() == nil {
			c := count()
			mu.Lock()
			most = max(most, c)
			mu.Unlock()
			sleepCtx(ctx, 20*time.Millisecond)
		}
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return most
	}
}

// mountedPods counts the mounts below the pods' directories.
func (n *procNode) mountedPods(pods []podVols) func() int {
	return func() int {
		infos, err := mount.ReadMountInfo()
		if err != nil {
			return 0
		}
		count := 0
		for _, p := range pods {
			count += len(mount.MountsUnder(infos, n.k.PodDir(p.pod)))
		}
		return count
	}
}

// waitFor polls cond every 20ms for at most d, and says whether it held.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// opRecord is one volume's retried operation.
type opRecord struct {
	group, op string
	pod, vol  string // the pod's name, the volume's
	attempts  []drivertest.Attempt
	err       error         // nil: done
	took      time.Duration // from the first attempt's start to the last one's end
}

// ledger records every retried operation of a test.
type ledger struct {
	mu   sync.Mutex
	recs []opRecord
}

func (l *ledger) add(pod *drivertest.Pod, v drivertest.InlineVolume, op string, attempts []drivertest.Attempt, err error) {
	r := opRecord{group: group(v), op: op, pod: pod.Name, vol: v.Name, attempts: attempts, err: err}
	if len(attempts) > 0 {
		last := attempts[len(attempts)-1]
		r.took = last.Start.Add(last.Latency).Sub(attempts[0].Start)
	}
	l.mu.Lock()
	l.recs = append(l.recs, r)
	l.mu.Unlock()
}

// mark returns a position in the ledger, for since.
func (l *ledger) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recs)
}

// since returns the records of op added after mark that keep selects (all
// when nil).
func (l *ledger) since(mark int, op string, keep func(opRecord) bool) []opRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []opRecord
	for _, r := range l.recs[mark:] {
		if r.op == op && (keep == nil || keep(r)) {
			out = append(out, r)
		}
	}
	return out
}

// inGroups keeps the records of the groups.
func inGroups(groups ...string) func(opRecord) bool {
	return func(r opRecord) bool { return slices.Contains(groups, r.group) }
}

// summary is what a set of records shows.
type summary struct {
	volumes, done int
	attempts, ok  int
	firstOK       int
	codes         map[codes.Code]int
	took          []time.Duration // of the volumes done, sorted
	firstFailure  string          // the message of one failed attempt
}

func summarize(recs []opRecord) summary {
	s := summary{codes: map[codes.Code]int{}}
	for _, r := range recs {
		s.volumes++
		if r.err == nil {
			s.done++
			s.took = append(s.took, r.took)
		}
		for i, a := range r.attempts {
			s.attempts++
			s.codes[a.Code]++
			if a.Err == nil {
				s.ok++
				if i == 0 {
					s.firstOK++
				}
			} else if s.firstFailure == "" {
				s.firstFailure = a.Err.Error()
			}
		}
	}
	slices.Sort(s.took)
	return s
}

// okShare is the share of attempts that succeeded.
func (s summary) okShare() float64 {
	if s.attempts == 0 {
		return 1
	}
	return float64(s.ok) / float64(s.attempts)
}

// pct is the p-th percentile (nearest rank) of the times of the volumes
// done; 0 when none.
func (s summary) pct(p float64) time.Duration { return percentile(s.took, p) }

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func (s summary) String() string {
	var codes []string
	for c, k := range s.codes {
		codes = append(codes, fmt.Sprintf("%v %d", c, k))
	}
	slices.Sort(codes)
	str := fmt.Sprintf("%d volumes, %d done; %d attempts, %d OK (%.2f%%), first attempt OK for %d; codes: %s",
		s.volumes, s.done, s.attempts, s.ok, 100*s.okShare(), s.firstOK, strings.Join(codes, ", "))
	if len(s.took) > 0 {
		str += fmt.Sprintf("; time to done p50 %v, p99 %v, max %v", s.pct(50).Round(time.Millisecond), s.pct(99).Round(time.Millisecond), s.took[len(s.took)-1].Round(time.Millisecond))
	}
	if s.firstFailure != "" {
		str += fmt.Sprintf("; e.g. %q", clip(s.firstFailure, 300))
	}
	return str
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// bound is the latency a control workload may reach under load: twice its
// baseline, or the baseline and 100ms, whichever is more.
func bound(baseline time.Duration) time.Duration {
	return max(2*baseline, baseline+100*time.Millisecond)
}
