//go:build linux && failpoints

package security

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/failpoint"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/test/internal/sysloop"
)

// The model test: a seeded random walk over everything a node does to a
// driver — publish, republish, unpublish, duplicate concurrent requests, a
// kill at a random failpoint, driver and kubelet restarts, a lost or damaged
// state file, a pod's directory removed behind the kubelet's back and the
// orphan GC — with every invariant checked after every step:
//
//   - each Published record has exactly one mount at its target, and every
//     mount at a target below the kubelet root has a Published record;
//   - no operation is left half done (no Publishing or Unpublishing record);
//   - no storage without a record (dir directories, loop backing files, loop
//     devices), and no record without its pod;
//   - capacity in use equals the sum of the records' sizes, per backend;
//   - nothing outside the kubelet root and the state dir changed;
//   - every live volume still holds the data its pod wrote.
//
// EPHEMERA_MODEL_STEPS sets the number of steps (default 10000),
// EPHEMERA_MODEL_SEED the seed (default: random, printed). A failure prints the
// seed and a shortened failing sequence.

func modelSteps() int {
	if n, err := strconv.Atoi(os.Getenv("EPHEMERA_MODEL_STEPS")); err == nil && n > 0 {
		return n
	}
	return 10000
}

type opKind int

const (
	opPublish opKind = iota
	opRepublish
	opDelete
	opDuplicate
	opCrashPublish
	opCrashUnpublish
	opRestart
	opKubeletRestart
	opLoseState
	opOrphan
)

var opNames = [...]string{"publish", "republish", "delete", "duplicate", "crash-publish", "crash-unpublish",
	"restart", "kubelet-restart", "lose-state", "orphan"}

// op is one step. Its numbers pick among what exists when it runs (modulo),
// so any subsequence of a walk is a valid walk too (for shrinking).
type op struct {
	kind opKind
	a, b int
}

func (o op) String() string { return fmt.Sprintf("%s(%d,%d)", opNames[o.kind], o.a, o.b) }

// weights of the op kinds, in opKind order.
var weights = [...]int{30, 14, 20, 6, 6, 5, 3, 3, 3, 3}

func genOps(seed uint64, n int) []op {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	total := 0
	for _, w := range weights {
		total += w
	}
	ops := make([]op, n)
	for i := range ops {
		x := r.IntN(total)
		k := 0
		for x >= weights[k] {
			x -= weights[k]
			k++
		}
		ops[i] = op{kind: opKind(k), a: r.IntN(1 << 20), b: r.IntN(1 << 20)}
	}
	return ops
}

// mvol and mpod are the model's idea of the node.
type mvol struct {
	name, backend string
	data          string // what the pod wrote; "" until published
}

type mpod struct {
	pod  *drivertest.Pod
	vols []*mvol
}

type model struct {
	t      *testing.T
	n      *node
	pods   []*mpod
	serial int
	fired  chan string
	armed  atomic.Value // string: the failpoint that crashes the next operation to hit it
}

// maxPods bounds the live pods, so that the walk deletes as much as it creates.
const maxPods = 8

var backendsByWeight = []string{"tmpfs", "tmpfs", "tmpfs", "dir", "dir", "loop"}

func TestModel(t *testing.T) {
	requireRoot(t)
	seed := rand.Uint64()
	if s, err := strconv.ParseUint(os.Getenv("EPHEMERA_MODEL_SEED"), 10, 64); err == nil {
		seed = s
	}
	steps := modelSteps()
	ops := genOps(seed, steps)
	start := time.Now()
	failed, err := runModel(t, ops, true)
	if err == nil {
		el := time.Since(start)
		t.Logf("seed %d: %d steps in %s (%.0f steps/s)", seed, steps, el.Round(time.Millisecond), float64(steps)/el.Seconds())
		return
	}
	t.Errorf("seed %d: step %d (%s): %v", seed, failed, ops[failed], err)
	short := shrink(t, ops[:failed+1])
	var b strings.Builder
	for _, o := range short {
		b.WriteString(o.String())
		b.WriteString(" ")
	}
	t.Errorf("shortened failing sequence (%d of %d steps; rerun with EPHEMERA_MODEL_SEED=%d EPHEMERA_MODEL_STEPS=%d): %s",
		len(short), failed+1, seed, failed+1, b.String())
}

// shrink removes chunks of a failing sequence while it still fails (on a
// fresh node each time), within a time budget.
func shrink(t *testing.T, ops []op) []op {
	deadline := time.Now().Add(3 * time.Minute)
	for chunk := len(ops) / 2; chunk >= 1 && time.Now().Before(deadline); chunk /= 2 {
		for i := 0; i+chunk <= len(ops) && time.Now().Before(deadline); {
			try := slices.Concat(ops[:i], ops[i+chunk:])
			fails := false
			t.Run("shrink", func(t *testing.T) {
				_, err := runModel(t, try, false)
				fails = err != nil
			})
			if fails {
				ops = try
			} else {
				i += chunk
			}
		}
	}
	return ops
}

// runModel runs ops on a fresh node and returns the first step whose
// invariants fail.
func runModel(t *testing.T, ops []op, verbose bool) (int, error) {
	n := newNode(t, func(o *framework.Options) {
		o.GC.Interval = 5 * time.Millisecond
		o.GC.OrphanGracePeriod = time.Nanosecond
		o.GC.MaxOrphanShare = 1 // the share rule has its own test
	})
	if err := os.WriteFile(filepath.Join(n.outside, "sentinel"), []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := &model{t: t, n: n, fired: make(chan string, 1)}
	var spent [len(opNames)]time.Duration
	var count [len(opNames)]int
	var checking time.Duration
	m.armed.Store("")
	failpoint.SetHook(m.hook)
	defer failpoint.SetHook(nil)
	for i, o := range ops {
		t0 := time.Now()
		kind, err := m.apply(o)
		t1 := time.Now()
		spent[kind] += t1.Sub(t0)
		count[kind]++
		if err != nil {
			return i, err
		}
		if err := m.check(); err != nil {
			return i, err
		}
		checking += time.Since(t1)
		if verbose && i > 0 && i%2000 == 0 {
			t.Logf("%d steps, %d live pods", i, len(m.pods))
		}
	}
	if verbose {
		var b strings.Builder
		for k := range opNames {
			if count[k] > 0 {
				fmt.Fprintf(&b, "%s %d×%s, ", opNames[k], count[k], (spent[k] / time.Duration(count[k])).Round(10*time.Microsecond))
			}
		}
		t.Logf("per step: %schecks %s", b.String(), (checking / time.Duration(len(ops))).Round(10*time.Microsecond))
	}
	// The end: delete every pod; nothing may be left.
	for len(m.pods) > 0 {
		if err := m.deletePod(0); err != nil {
			return len(ops) - 1, err
		}
	}
	return len(ops) - 1, m.check()
}

// hook is the failpoint hook: the armed failpoint stops the operation that
// reaches it, as a kill -9 of the driver there would.
func (m *model) hook(name string) {
	if m.armed.CompareAndSwap(name, "") {
		m.fired <- name
		runtime.Goexit()
	}
}

func (m *model) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

func (m *model) newPod(a int) *mpod {
	m.serial++
	p := &mpod{pod: m.n.h.Kubelet.NewPod("default", fmt.Sprintf("p%d", m.serial))}
	for i := range 1 + a%2 {
		p.vols = append(p.vols, &mvol{name: fmt.Sprintf("v%d", i), backend: backendsByWeight[(a>>1+i)%len(backendsByWeight)]})
	}
	return p
}

func (m *model) inline(v *mvol) drivertest.InlineVolume {
	return drivertest.InlineVolume{Name: v.name, Attributes: attrs[v.backend]}
}

// publishPod publishes every volume of p and writes its data.
func (m *model) publishPod(p *mpod) error {
	ctx, cancel := m.ctx()
	defer cancel()
	for _, v := range p.vols {
		if err := m.n.h.Kubelet.Publish(ctx, p.pod, m.inline(v)); err != nil {
			return fmt.Errorf("publishing %s/%s (%s): %w", p.pod.Name, v.name, v.backend, err)
		}
		if v.data == "" {
			v.data = fmt.Sprintf("%s/%s %d", p.pod.Name, v.name, m.serial)
			target := m.n.h.Kubelet.TargetPath(p.pod, v.name)
			if err := os.WriteFile(filepath.Join(target, "data"), []byte(v.data), 0o644); err != nil {
				return fmt.Errorf("writing into %s: %w", target, err)
			}
		}
	}
	return nil
}

func (m *model) deletePod(i int) error {
	p := m.pods[i]
	ctx, cancel := m.ctx()
	defer cancel()
	if err := m.n.h.Kubelet.DeletePod(ctx, p.pod); err != nil {
		return fmt.Errorf("deleting pod %s: %w", p.pod.Name, err)
	}
	m.pods = slices.Delete(m.pods, i, i+1)
	return nil
}

// crash runs fn with failpoint fp armed, waits for an operation to reach it,
// and then "kills" the driver: the stopped operation's client gives up, the
// driver instance is stopped and a new one started on the same node.
func (m *model) crash(fp string, fn func(ctx context.Context) error) error {
	m.armed.Store(fp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case <-m.fired:
		cancel()
		<-done
	case err := <-done: // the failpoint was not on this operation's path
		cancel()
		m.armed.Store("")
		return err
	case <-time.After(30 * time.Second):
		cancel()
		return fmt.Errorf("failpoint %s never reached", fp)
	}
	m.armed.Store("")
	m.n.h.RestartDriver()
	return nil
}

func (m *model) apply(o op) (opKind, error) {
	if len(m.pods) == 0 && o.kind != opPublish {
		o.kind = opPublish
	}
	if len(m.pods) >= maxPods && (o.kind == opPublish || o.kind == opCrashPublish || o.kind == opDuplicate) {
		o.kind = opDelete
	}
	return o.kind, m.do(o)
}

func (m *model) do(o op) error {
	switch o.kind {
	case opPublish:
		p := m.newPod(o.a)
		m.pods = append(m.pods, p)
		return m.publishPod(p)
	case opRepublish:
		p := m.pods[o.a%len(m.pods)]
		ctx, cancel := m.ctx()
		defer cancel()
		v := p.vols[o.b%len(p.vols)]
		return m.n.h.Kubelet.Republish(ctx, p.pod, v.name)
	case opDelete:
		return m.deletePod(o.a % len(m.pods))
	case opDuplicate:
		// A new volume: the kubelet's publish and three copies of its request
		// at once. At most one may mount; all end published once.
		p := m.newPod(o.a)
		p.vols = p.vols[:1]
		m.pods = append(m.pods, p)
		req := m.n.h.Kubelet.PublishRequest(p.pod, m.inline(p.vols[0]))
		ctx, cancel := m.ctx()
		defer cancel()
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { _, _ = m.n.h.Node.NodePublishVolume(ctx, req) })
		}
		err := m.publishPod(p)
		wg.Wait()
		if err != nil {
			// Aborted by a concurrent copy: the kubelet retries.
			return m.publishPod(p)
		}
		return nil
	case opCrashPublish:
		p := m.newPod(o.a)
		m.pods = append(m.pods, p)
		fps := failpoint.Publish
		if p.vols[0].backend == "loop" {
			fps = slices.Concat(loop.Failpoints, fps)
		}
		fp := fps[o.b%len(fps)]
		if err := m.crash(fp, func(ctx context.Context) error {
			return m.n.h.Kubelet.Publish(ctx, p.pod, m.inline(p.vols[0]))
		}); err != nil {
			return fmt.Errorf("publish with failpoint %s: %w", fp, err)
		}
		if o.b%3 == 0 { // the pod went away meanwhile
			return m.deletePod(len(m.pods) - 1)
		}
		return m.publishPod(p) // the kubelet retries
	case opCrashUnpublish:
		i := o.a % len(m.pods)
		p := m.pods[i]
		fp := failpoint.Unpublish[o.b%len(failpoint.Unpublish)]
		if err := m.crash(fp, func(ctx context.Context) error {
			return m.n.h.Kubelet.DeletePod(ctx, p.pod)
		}); err != nil && !isTransient(err) {
			return fmt.Errorf("delete with failpoint %s: %w", fp, err)
		}
		return m.deletePod(i) // the kubelet retries
	case opRestart:
		m.n.h.RestartDriver()
		return nil
	case opKubeletRestart:
		ctx, cancel := m.ctx()
		defer cancel()
		return m.n.h.Kubelet.Restart(ctx)
	case opLoseState:
		m.n.stop()
		damage := []string{"deleted", "truncated to zero", "truncated to 16KiB", "meta pages garbage"}[o.b%4]
		loseState[damage](m.t, m.n.statePath())
		m.n.start()
		if o.b%2 == 0 {
			ctx, cancel := m.ctx()
			defer cancel()
			return m.n.h.Kubelet.Restart(ctx)
		}
		return nil
	case opOrphan:
		// The pod's directory goes behind the kubelet's back (its mounts
		// first, as a reboot would take them): the GC must remove its volumes.
		i := o.a % len(m.pods)
		p := m.pods[i]
		dir := m.n.h.Kubelet.PodDir(p.pod)
		if _, err := unmountBelow(dir, true); err != nil {
			return err
		}
		if err := m.n.h.Kubelet.OrphanPod(p.pod); err != nil {
			return err
		}
		m.pods = slices.Delete(m.pods, i, i+1)
		deadline := time.Now().Add(10 * time.Second)
		for _, v := range p.vols {
			for m.n.hasRecord(api.VolumeHandle(p.pod.UID, v.name)) {
				if time.Now().After(deadline) {
					return fmt.Errorf("the GC never removed %s/%s of the orphaned pod", p.pod.Name, v.name)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		// The GC's teardown releases the volume's capacity right after it
		// deletes the record: the step ends when that is done too, so that the
		// invariants are checked after the removal, not in its middle.
		for {
			ctx, cancel := m.ctx()
			recs, err := m.n.h.Driver().Records(ctx)
			cancel()
			if err == nil {
				if err = m.checkCapacity(recs); err == nil {
					return nil
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("after the GC removed the orphaned pod's records: %w", err)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

func isTransient(err error) bool {
	return err != nil && !drivertest.IsFinal(err)
}

// check verifies every invariant of the node against the driver's records and
// the model.
func (m *model) check() error {
	n := m.n
	ctx, cancel := m.ctx()
	defer cancel()
	recs, err := n.h.Driver().Records(ctx)
	if err != nil {
		return err
	}
	infos, err := mount.ReadMountInfo()
	if err != nil {
		return err
	}
	byID := map[string]*store.Record{}
	for _, r := range recs {
		byID[r.VolumeID] = r
		if r.Phase != store.PhasePublished {
			return fmt.Errorf("record %s left in phase %s", r.VolumeID, r.Phase)
		}
		if at := mount.MountsAt(infos, r.TargetPath); at != 1 {
			return fmt.Errorf("published volume %s (%s) has %d mounts at its target", r.VolumeID, r.Backend, at)
		}
	}
	// Mounts below the root: exactly the published targets.
	for _, mi := range mount.MountsUnder(infos, n.root) {
		if mi.MountPoint == filepath.Join(n.root, "pods") {
			continue
		}
		found := false
		for _, r := range recs {
			if r.TargetPath == mi.MountPoint {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("mount at %s (%s from %s) has no record", mi.MountPoint, mi.FSType, mi.Source)
		}
	}
	// Nothing mounted elsewhere on the node, nothing outside changed.
	for _, mi := range mount.MountsUnder(infos, n.base) {
		if mi.MountPoint != n.base && !strings.HasPrefix(mi.MountPoint, n.root+"/") {
			return fmt.Errorf("mount outside the kubelet root: %s", mi.MountPoint)
		}
	}
	if b, err := os.ReadFile(filepath.Join(n.outside, "sentinel")); err != nil || string(b) != "untouched" {
		return fmt.Errorf("the file outside the kubelet root changed: %q, %v", b, err)
	}
	// The model's live volumes: each recorded, mounted, holding its data.
	live := map[string]bool{}
	for _, p := range m.pods {
		for _, v := range p.vols {
			id := api.VolumeHandle(p.pod.UID, v.name)
			live[id] = true
			r := byID[id]
			if r == nil {
				return fmt.Errorf("live volume %s/%s (%s) has no record", p.pod.Name, v.name, v.backend)
			}
			b, err := os.ReadFile(filepath.Join(r.TargetPath, "data"))
			if err != nil || string(b) != v.data {
				return fmt.Errorf("live volume %s/%s (%s) lost its data: %q, %v; want %q", p.pod.Name, v.name, v.backend, b, err, v.data)
			}
		}
	}
	for id, r := range byID {
		if !live[id] {
			return fmt.Errorf("record %s (%s, pod %s) belongs to no live pod", id, r.Backend, r.Pod.UID)
		}
	}
	// Storage: exactly the records' (dir directories, loop files and devices).
	for dir, ext := range map[string]string{filepath.Join(n.state, "volumes"): "", filepath.Join(n.state, "loop"): ".img"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			id, ok := strings.CutSuffix(e.Name(), ext)
			if strings.HasPrefix(e.Name(), ".") || !ok {
				continue
			}
			if byID[id] == nil {
				return fmt.Errorf("storage without a record: %s", filepath.Join(dir, e.Name()))
			}
		}
	}
	loops := 0
	for _, r := range recs {
		if r.Backend == "loop" {
			loops++
		}
	}
	if l := sysloop.Below(n.base); len(l) != loops {
		return fmt.Errorf("%d loop devices for %d loop volumes: %v", len(l), loops, l)
	}
	// Capacity accounting equals the records.
	return m.checkCapacity(recs)
}

func (m *model) checkCapacity(recs []*store.Record) error {
	want := map[string][2]int64{}
	for _, r := range recs {
		w := want[r.Backend]
		w[0]++
		w[1] += r.Size
		want[r.Backend] = w
	}
	rec := httptest.NewRecorder()
	m.n.h.Driver().Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	got := map[string][2]int64{}
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		for i, name := range []string{"ephemera_volumes{", "ephemera_volume_bytes{"} {
			if !strings.HasPrefix(line, name) {
				continue
			}
			b, rest, _ := strings.Cut(strings.TrimPrefix(line, name+`backend="`), `"}`)
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				return fmt.Errorf("metrics line %q: %v", line, err)
			}
			g := got[b]
			g[i] = int64(v)
			got[b] = g
		}
	}
	for b, w := range want {
		if got[b] != w {
			return fmt.Errorf("capacity of backend %s: %d volumes, %d bytes accounted; the records hold %d, %d", b, got[b][0], got[b][1], w[0], w[1])
		}
	}
	for b, g := range got {
		if _, ok := want[b]; !ok && g != [2]int64{} {
			return fmt.Errorf("capacity of backend %s: %d volumes, %d bytes accounted without records", b, g[0], g[1])
		}
	}
	return nil
}
