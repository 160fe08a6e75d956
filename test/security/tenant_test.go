//go:build linux && !race

// Outside -race: the test measures the driver's memory cgroup and bounds
// every healthy pod's publish and refresh in time; make test-model runs it.

package security

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/test/internal/hostile"
)

// TestTenantActions (issue 44 item 5) is the tenant property: whatever a pod
// does to its own volumes, and whatever a plugin answers, the driver pays
// for none of it, and the node's other pods do not notice.
//
// The shipped driver runs as a process of its own in a memory cgroup of its
// own, limited as deploy/base limits its container, with the memory plan's
// flags of that manifest (--content-bytes-in-flight, --content-capacity,
// --stats-max-walks, --memory-limit, ...). Pods are the kubelet's pod
// cgroups, made by the test below the cgroup it runs in
// (<ours>/ephemera-tenant-<random>/kubepods/burstable/pod<UID>, each with a
// memory limit; the driver's --kubelet-cgroup-root points there), each with
// a process in it (a tenant agent: this test binary re-executed) that does
// to the pod's volumes what the test asks, as a container would. Content
// volumes are served by plugins of test/internal/hostile: "token" and
// "bulk" answer new content every time (mode rotate: a 16 KiB and a 1 MiB
// blob), so that every refresh swaps the files; hang, trickle, flood, crash,
// late and flap misbehave, each behind pods that come and go all along.
//
// A seeded walk (EPHEMERA_TENANT_SEED, logged) of 10 rounds, on 3 healthy
// pods (a token volume, a read-only one, a scratch tmpfs; one in three made
// with its cgroup only after its publish began, as the kubelet's pod worker
// may) and 4 to 7 attacking ones (a writable bulk volume, sometimes a
// read-only one, a scratch tmpfs; each with 2 to 4 actions of the
// catalogue). In each round every attacker does one or two of its actions
// to its volumes — a sparse file of 1 TiB, a directory named like the
// driver's content (..2020_01_01_00_00_00.N) holding one, hard links to the
// current content files, descriptors held open on them (also on a
// read-only volume), the current files or their whole directory renamed
// out of the content directory, the volume filled (all of it, up to its
// size or the pod's memory limit first, or a few MiB), a deep and a wide
// tree, symbolic links planted at ..data_tmp and at a file's name pointing
// out of the volume, a write into a read-only volume — then every content
// volume of every pod is republished at once (a refresh), the attackers act
// again (what they made is there when the node is checked), healthy pods
// read their new token from their own process, some pods are deleted and
// replaced (a pod's process the OOM killer ended is started again), and
// once, at a seeded round, the driver is restarted in its cgroup. It runs
// in both charging modes: the pods' cgroups (pod-cgroup, the fake kubepods
// tree, --kubelet-cgroup-driver=auto) and the fallback (volume-size,
// --pod-cgroups=off; there the pods' volumes are sized so that the content
// capacity, partitioned by provider, holds them all: what the attackers do
// must change nothing of it). After every round:
//
//   - the driver's cgroup peak (memory.max_usage_in_bytes, from the
//     driver's first instruction) stays under its memory plan
//     (framework.MemoryNeeded of the manifest's flags; in pod-cgroup mode
//     without the content capacity, since the driver then holds none),
//     never reaches its limit (failcnt 0), and the driver is never killed;
//   - the tmpfs pages charged to the driver's cgroup grow by no more than
//     ephemera_content_held_bytes (plus 4 MiB for its state file): the
//     pages of the content it wrote do not outlive its count, whatever the
//     pods keep alive; in pod-cgroup mode, where it counts none, they do
//     not grow;
//   - ephemera_content_held_bytes is at most what the kernel lets the
//     mounted content volumes hold (statfs: their size, and 1Ki per inode):
//     it never reports more than the kernel does (0 in pod-cgroup mode),
//     and no sparse file or forged name inflates it, also after a restart;
//   - in pod-cgroup mode every page in a pod's memory-backed volumes is
//     charged to the pod's own cgroup (its total_shmem holds their statfs
//     usage);
//   - every healthy pod's publish, and each of its refreshes, succeeds
//     within 5s of its first attempt (the kubelet's retries, scaled), each
//     refresh gives the pod new content (the token its process reads is
//     the plugin's newer answer), and no process of a healthy pod is
//     OOM-killed;
//   - for every pod, a refresh that answers OK refreshed (no silent
//     refusal), and one that does not leaves the old content (or the
//     driver's own retry's newer one) and answers a code the kubelet
//     retries, never Internal or Unknown;
//   - a read-only volume is never writable;
//   - at the end every pod is deleted and nothing is left (mounts, pod
//     directories, the content count back to 0), and nothing outside the
//     volumes changed (the planted links' target).
//
// Each mode takes 8-20s on 2 cores (the pod-cgroup mode more: a writer
// process per write). The cgroups are made below this process's own
// memory cgroup (cgroup v1; skipped elsewhere) and removed at the end, also
// after a failure, with every process and mount. The walk of the pre-wiring
// driver (2133fc4) fails it (its cgroup holds 5 MiB of tmpfs pages it does
// not count), and so does ac28008's (a refresh answers OK without
// refreshing; a restart counts 4 TiB of a pod's sparse file).
func TestTenantActions(t *testing.T) {
	requireRoot(t)
	seed := rand.Uint64()
	if s, err := strconv.ParseUint(os.Getenv("EPHEMERA_TENANT_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (EPHEMERA_TENANT_SEED=%d reruns it)", seed, seed)
	cgRoot := sessionMemoryCgroup(t)
	bin := driverBinary(t)
	plan := manifestPlan(t)
	help, _ := exec.Command(bin, "-h").CombinedOutput()
	wired := strings.Contains(string(help), "-pod-cgroups")
	for _, mode := range []string{chargePod, chargeVolumeSize} {
		t.Run(mode, func(t *testing.T) {
			if !wired && mode == chargePod {
				t.Skip("this driver has no --pod-cgroups")
			}
			runTenants(t, tenantConfig{mode: mode, seed: seed, plan: plan, session: cgRoot, wired: wired})
		})
	}
}

// The charging modes (ephemera_content_charging's label).
const (
	chargePod        = "pod-cgroup"
	chargeVolumeSize = "volume-size"
)

const (
	// tenantRounds is the number of rounds of a walk.
	tenantRounds = 10
	// tenantWithin bounds a healthy pod's publish and each of its refreshes,
	// from the first attempt to the success, retries included.
	tenantWithin = 5 * time.Second
	// tokenBlob and bulkBlob are the blobs of the token and bulk plugins'
	// answers.
	tokenBlob = 16 << 10
	bulkBlob  = 1 << 20
	// shmemSlack is what the driver's cgroup may hold of tmpfs pages beyond
	// what it had when it was ready and the content it counts: its state
	// file's growth (bbolt in the node's tmpfs).
	shmemSlack = 4 << 20
)

// tenantConfig is one walk's.
type tenantConfig struct {
	mode    string
	seed    uint64
	plan    memoryPlan
	session string // the memory cgroup this test runs in, below the hierarchy's root
	wired   bool   // the driver has --pod-cgroups
}

// memoryPlan is the driver container's memory limit and the flags of the
// memory plan, as deploy/base sets them.
type memoryPlan struct {
	limit int64
	flags []string // --NAME=VALUE
	// needed is framework.MemoryNeeded of the flags: the least limit that
	// holds the plan.
	needed int64
	// podCharged is the plan where pods are charged for their content: the
	// same without the content capacity, which the driver then holds none
	// of.
	podCharged int64
}

// bound is the driver's plan in mode.
func (p memoryPlan) bound(mode string) int64 {
	if mode == chargePod {
		return p.podCharged
	}
	return p.needed
}

// manifestPlan reads the driver container of deploy/base/daemonset.yaml.
func manifestPlan(t *testing.T) memoryPlan {
	t.Helper()
	b, err := os.ReadFile("../../deploy/base/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name      string
						Args      []string
						Resources struct {
							Limits map[string]string
						}
					}
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	var p memoryPlan
	var inFlight, capacity int64
	walks := -1
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "driver" {
			continue
		}
		q, err := resource.ParseQuantity(c.Resources.Limits["memory"])
		if err != nil {
			t.Fatalf("deploy/base: the driver's memory limit: %v", err)
		}
		p.limit = q.Value()
		for _, a := range c.Args {
			name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			switch name {
			case "content-bytes-in-flight", "content-capacity":
				q, err := resource.ParseQuantity(value)
				if err != nil {
					t.Fatalf("deploy/base: %s: %v", a, err)
				}
				if name == "content-capacity" {
					capacity = q.Value()
				} else {
					inFlight = q.Value()
				}
			case "stats-max-walks":
				walks, _ = strconv.Atoi(value)
			case "default-size", "max-volume-size", "tmpfs-max-inodes":
			case "capacity":
				// The tmpfs budget only: the node has no other backend.
				for _, kv := range strings.Split(value, ",") {
					if strings.HasPrefix(kv, "tmpfs=") {
						p.flags = append(p.flags, "--capacity="+kv)
					}
				}
				continue
			default:
				continue
			}
			p.flags = append(p.flags, a)
		}
	}
	if p.limit <= 0 || inFlight <= 0 || capacity <= 0 || walks < 0 {
		t.Fatalf("deploy/base: the driver's limit %d, --content-bytes-in-flight %d, --content-capacity %d, --stats-max-walks %d: not all found", p.limit, inFlight, capacity, walks)
	}
	p.flags = append(p.flags, "--memory-limit="+strconv.FormatInt(p.limit, 10))
	p.needed = framework.MemoryNeeded(inFlight, capacity, walks)
	p.podCharged = framework.MemoryNeeded(inFlight, 0, walks)
	return p
}

// sessionMemoryCgroup returns the memory cgroup this process runs in, as a
// path below the v1 memory hierarchy's root, and skips the test where there
// is none to make cgroups below.
func sessionMemoryCgroup(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(cgroupMount, "memory", "cgroup.procs")); err != nil {
		// On v2 the session's own cgroup holds processes, so no controller
		// can be enabled for cgroups made below it.
		t.Skipf("no cgroup v1 memory hierarchy at %s/memory: %v", cgroupMount, err)
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			return parts[2]
		}
	}
	t.Skip("this process is in no memory cgroup")
	return ""
}

// cgroupMount is where the host's cgroup tree is mounted.
const cgroupMount = "/sys/fs/cgroup"

// memcg is a v1 memory cgroup the test made.
type memcg string

func (c memcg) dir() string { return string(c) }

// value reads a cgroup file of one number; -1 when it cannot.
func (c memcg) value(file string) int64 {
	b, err := os.ReadFile(filepath.Join(string(c), file))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// stat reads key of memory.stat; -1 when it cannot.
func (c memcg) stat(key string) int64 {
	b, err := os.ReadFile(filepath.Join(string(c), "memory.stat"))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// shmem is the tmpfs pages charged to the cgroup and its descendants.
func (c memcg) shmem() int64 { return c.stat("total_shmem") }

// oomKills is the number of processes its OOM killer killed (v1
// memory.oom_control's oom_kill); 0 when it cannot tell.
func (c memcg) oomKills() int {
	b, err := os.ReadFile(filepath.Join(string(c), "memory.oom_control"))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

func (c memcg) set(t *testing.T, file string, v int64) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(string(c), file), []byte(strconv.FormatInt(v, 10)), 0o644); err != nil {
		t.Fatalf("%s/%s: %v", c, file, err)
	}
}

// tenantCgroups is the test's cgroup tree: a root below the session's
// memory cgroup, the driver's cgroup in it, and the kubelet's kubepods
// tree as a kubelet of that cgroup root and the cgroupfs driver lays it out.
type tenantCgroups struct {
	rel    string // the root, below the hierarchy's: the kubelet's cgroup root
	root   memcg
	driver memcg
	pods   string // kubepods/burstable
}

// newTenantCgroups makes the tree, and removes it at cleanup (registered
// before anything runs in it, so after everything in it stopped).
func newTenantCgroups(t *testing.T, session string) *tenantCgroups {
	t.Helper()
	rel := filepath.Join(session, fmt.Sprintf("ephemera-tenant-%08x", rand.Uint32()))
	c := &tenantCgroups{rel: rel, root: memcg(filepath.Join(cgroupMount, "memory", rel))}
	c.driver = memcg(filepath.Join(c.root.dir(), "driver"))
	c.pods = filepath.Join(c.root.dir(), "kubepods", "burstable")
	if err := os.Mkdir(c.root.dir(), 0o755); err != nil {
		t.Skipf("no memory cgroup to run in: %v", err)
	}
	t.Cleanup(func() { removeCgroupTree(t, c.root.dir()) })
	for _, d := range []string{c.driver.dir(), c.pods} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// removeCgroupTree removes the cgroups below and at dir, deepest first,
// killing what still runs in them.
func removeCgroupTree(t *testing.T, dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		var err error
		for range 100 {
			if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if b, rerr := os.ReadFile(filepath.Join(d, "cgroup.procs")); rerr == nil {
				for f := range strings.FieldsSeq(string(b)) {
					if pid, _ := strconv.Atoi(f); pid > 0 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			t.Errorf("removing cgroup %s: %v", d, err)
		}
	}
}

// podCgroup makes the cgroup of pod uid, limited to limit bytes.
func (c *tenantCgroups) podCgroup(uid string, limit int64) (memcg, error) {
	cg := memcg(filepath.Join(c.pods, "pod"+uid))
	if err := os.Mkdir(cg.dir(), 0o755); err != nil {
		return "", err
	}
	return cg, os.WriteFile(filepath.Join(cg.dir(), "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644)
}

// tenantAgent is a tenant agent process, a pod's "container".
type tenantAgent struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	mu   sync.Mutex
	dead bool // killed, or found dead, and reaped
}

// startAgent starts an agent in cg.
func startAgent(cg memcg) (*tenantAgent, error) {
	cmd := exec.Command("/bin/sh", "-c", `echo $$ >"$0" && exec "$@"`, filepath.Join(cg.dir(), "cgroup.procs"), os.Args[0])
	cmd.Env = append(os.Environ(), envTenantAgent+"=1", "GOMAXPROCS=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &tenantAgent{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	a.out.Buffer(nil, 1<<20)
	return a, nil
}

// startAgent starts an agent in cg, stopped at cleanup at the latest.
func (r *tenantRun) startAgent(cg memcg) (*tenantAgent, error) {
	a, err := startAgent(cg)
	if err == nil {
		r.mu.Lock()
		r.agents = append(r.agents, a)
		r.mu.Unlock()
	}
	return a, err
}

// errAgentGone is the answer of an agent that died (its pod's cgroup's OOM
// killer, most likely) or was stopped.
var errAgentGone = errors.New("the pod's process is gone")

// do asks the agent to do op.
func (a *tenantAgent) do(op agentOp) (agentReply, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.dead {
		return agentReply{}, errAgentGone
	}
	b, _ := json.Marshal(op)
	var r agentReply
	if _, err := a.in.Write(append(b, '\n')); err != nil || !a.out.Scan() {
		a.reap()
		return r, errAgentGone
	}
	if err := json.Unmarshal(a.out.Bytes(), &r); err != nil {
		return r, err
	}
	if r.Err != "" {
		return r, agentError{r}
	}
	return r, nil
}

// agentError is an op that failed in the agent.
type agentError struct{ r agentReply }

func (e agentError) Error() string { return e.r.Err }

func (e agentError) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	return ok && e.r.Errno != 0 && syscall.Errno(e.r.Errno) == errno
}

// stop kills the agent and reaps it, as the kubelet kills a pod's
// containers before it tears down its volumes.
func (a *tenantAgent) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reap()
}

// reap kills the agent, if it still runs, and waits for it (a.mu held).
func (a *tenantAgent) reap() {
	if a.dead {
		return
	}
	a.dead = true
	if a.cmd != nil {
		_ = a.cmd.Process.Kill()
		_ = a.cmd.Wait()
	}
}

// gone says whether the agent died (or was stopped).
func (a *tenantAgent) gone() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dead
}

// tenantVol is a volume of a tenant pod.
type tenantVol struct {
	drivertest.InlineVolume
	content bool // a plugin's, whose files the driver writes
}

// tenantPod is a pod of the walk.
type tenantPod struct {
	kind    string // "healthy", "attacker", or the hostile plugin mode it uses
	pod     *drivertest.Pod
	vols    []tenantVol
	cg      memcg
	agent   *tenantAgent // nil for the plugin load's pods
	actions []string     // an attacker's catalogue

	mu     sync.Mutex
	serial map[string]int64 // the token's serial after the last refresh, by volume
	did    []string         // what it did, for the log
}

func (p *tenantPod) setSerial(vol string, n int64) {
	p.mu.Lock()
	p.serial[vol] = n
	p.mu.Unlock()
}

func (p *tenantPod) getSerial(vol string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.serial[vol]
}

// history is what the pod did, for a message.
func (p *tenantPod) history() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.did) == 0 {
		return "nothing"
	}
	return strings.Join(p.did, " ")
}

func (p *tenantPod) healthy() bool { return p.kind == "healthy" }

func (p *tenantPod) inline() []drivertest.InlineVolume {
	out := make([]drivertest.InlineVolume, len(p.vols))
	for i, v := range p.vols {
		out[i] = v.InlineVolume
	}
	return out
}

// tenantRun is one walk.
type tenantRun struct {
	t         *testing.T
	cfg       tenantConfig
	n         *procNode
	cgs       *tenantCgroups
	metrics   string
	outside   string    // a directory outside the volumes the planted links point into
	restartAt int       // the round after which the driver is restarted
	began     time.Time // when the walk began
	shmem0    int64     // the driver's cgroup's tmpfs pages when it was ready

	mu     sync.Mutex
	r      *rand.Rand
	serial int
	pods   map[string]*tenantPod // live, by UID
	agents []*tenantAgent        // every agent started, stopped at cleanup
	maxRO  int                   // the most read-only bulk volumes the attackers have at once; -1: no bound
	ro     int                   // the read-only bulk volumes they have

	// What came of it: the codes of the refreshes of attacking pods, how
	// the attacks went (name → "ok" or the error's end), the OOM kills.
	outMu     sync.Mutex
	refreshes map[string]map[codes.Code]int // kind → code → count
	attacks   map[string]map[string]int
	worst     map[string]string // one failure message per code
	oomKills  map[string]int    // kind → processes its pods' cgroups OOM-killed
}

// Sizes of the volumes, and the pods' memory limits. A bulk volume holds
// two answers (old and new) and a little, in volume-size mode, so that a
// third generation kept alive fills it; in pod-cgroup mode it is larger
// than the pod's limit, so that the pod's limit is the bound.
func (r *tenantRun) bulkSize() string {
	if r.cfg.mode == chargePod {
		return "64Mi"
	}
	return "3Mi"
}

const (
	tokenSize     = "1Mi"
	hostileSize   = "1Mi"
	scratchSize   = "8Mi"
	healthyLimit  = 64 << 20
	attackerLimit = 24 << 20
)

// tenantPlugins are the walk's plugins: the two rotating ones pods use, and
// one of each hostile content mode, whose answers are bounded to 512 KiB
// (a flood answer fits a 1Mi volume).
func tenantPlugins() []pluginSpec {
	specs := []pluginSpec{
		{name: "token", mode: hostile.Rotate, maxBytes: 1 << 20, rotateBytes: tokenBlob},
		{name: "bulk", mode: hostile.Rotate, maxBytes: 2 << 20, rotateBytes: bulkBlob},
	}
	for _, m := range hostile.ContentModes {
		s := pluginSpec{name: string(m), mode: m, maxBytes: 512 << 10}
		if m == hostile.Crash {
			s.restart = scaled(10 * time.Second)
		}
		specs = append(specs, s)
	}
	return specs
}

func runTenants(t *testing.T, cfg tenantConfig) {
	start := time.Now()
	cgs := newTenantCgroups(t, cfg.session)
	cgs.driver.set(t, "memory.limit_in_bytes", cfg.plan.limit)
	r := &tenantRun{t: t, cfg: cfg, r: rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x7465_6e61_6e74)), cgs: cgs,
		pods: map[string]*tenantPod{}, refreshes: map[string]map[codes.Code]int{}, attacks: map[string]map[string]int{}, worst: map[string]string{}, oomKills: map[string]int{}}
	r.restartAt = 3 + r.r.IntN(5)
	r.began = start
	r.metrics = freeAddress(t)
	flags := append(slices.Clone(cfg.plan.flags), "--metrics-address="+r.metrics)
	switch {
	case cfg.mode == chargePod:
		flags = append(flags, "--pod-cgroups=auto", "--pod-cgroup-mount="+cgroupMount,
			"--kubelet-cgroup-root="+cgs.rel, "--kubelet-cgroup-driver=auto", "--pod-cgroup-wait=2s")
	case cfg.wired:
		flags = append(flags, "--pod-cgroups=off")
	}
	r.n = startProcNodeWith(t, procNodeOptions{driverCgroup: cgs.driver.dir()}, tenantPlugins(), flags...)
	r.n.k.SetRetry(kubeletBackoff)
	t.Cleanup(func() { // before the node's cleanup: no process of a pod holds a volume then
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, a := range r.agents {
			a.stop()
		}
	})
	r.outside = filepath.Join(r.n.base, "outside")
	if err := os.MkdirAll(r.outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.outside, "sentinel"), []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg.wired {
		if got := r.metric(`ephemera_content_charging{mode="` + cfg.mode + `"}`); got != 1 {
			t.Fatalf("ephemera_content_charging{mode=%q} is %v, want 1: the driver charges otherwise\n%s", cfg.mode, got, r.n.logTail("driver.log", 3000))
		}
	}
	r.shmem0 = cgs.driver.shmem()
	t.Logf("%s: the driver's cgroup limited to %s (deploy/base), its plan %s (framework.MemoryNeeded; the manifest's %s); ready at %s, of it tmpfs %s; flags %s",
		cfg.mode, mibs(cfg.plan.limit), mibs(cfg.plan.bound(cfg.mode)), mibs(cfg.plan.needed), mibs(cgs.driver.value("memory.usage_in_bytes")), mibs(r.shmem0), strings.Join(flags, " "))

	// The plugin load: pods of each hostile mode that come and go.
	loadCtx, stopLoad := context.WithCancel(r.n.ctx)
	defer stopLoad()
	var load sync.WaitGroup
	for _, m := range hostile.ContentModes {
		load.Add(1)
		r.n.goRun(func() {
			defer load.Done()
			r.pluginLoad(loadCtx, string(m))
		})
	}

	// The pods: healthy ones (one of them whose cgroup comes late), and
	// attackers. In volume-size mode each content volume takes what its tmpfs can
	// hold of the content capacity, which is partitioned by provider
	// (each of the 8 has 1/16 to itself, and half is shared): the healthy
	// pods' token volumes (2Mi each: 1Mi and 1023 inodes) take 12Mi, 8 of
	// them shared, and the attackers' bulk volumes (4Mi each) at most 24Mi,
	// 20 of them shared; the plugin load's stay in their own. So there are
	// at most 6 bulk volumes there (an attacker replaced is deleted before
	// its successor is made), and the healthy pods always fit: what the
	// attackers do changes nothing of it.
	const healthy = 3
	attackers := 5 + r.r.IntN(3)
	r.maxRO = -1
	if cfg.mode == chargeVolumeSize {
		attackers = 4 + r.r.IntN(2)
		r.maxRO = 6 - attackers
	}
	var wg sync.WaitGroup
	for i := range healthy {
		wg.Go(func() { r.newHealthy(i == 0) })
	}
	for range attackers {
		wg.Go(func() { r.newAttacker() })
	}
	wg.Wait()
	r.check("published")

	for round := range tenantRounds {
		r.round(round)
		if t.Failed() {
			break
		}
	}

	stopLoad()
	load.Wait()
	r.teardown()
	r.report()
	t.Logf("%s: took %v", cfg.mode, time.Since(start).Round(time.Millisecond))
}

// freeAddress is a free TCP address on the loopback.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metric is the value of the series (name and labels, as exposed) on the
// driver's /metrics; 0 when absent, -1 when the driver does not answer.
func (r *tenantRun) metric(series string) float64 {
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// intn is the walk's random number in [0, n).
func (r *tenantRun) intn(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.IntN(n)
}

func mibs(b int64) string {
	if b < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// newPod makes a pod of kind with vols: its cgroup (limit), its agent (but
// for the plugin load's pods), and publishes it as the kubelet does.
// A healthy pod must be published within tenantWithin; lateCgroup makes its
// cgroup only after its publish began (the kubelet's pod worker and volume
// manager run independently).
func (r *tenantRun) newPod(kind string, vols []tenantVol, limit int64, lateCgroup bool) *tenantPod {
	r.mu.Lock()
	r.serial++
	p := &tenantPod{kind: kind, pod: r.n.k.NewPod("tenant", fmt.Sprintf("%s-%d", kind, r.serial)), vols: vols, serial: map[string]int64{}}
	delay := time.Duration(50+r.r.IntN(300)) * time.Millisecond
	r.pods[p.pod.UID] = p
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.n.ctx, tenantWithin)
	defer cancel()
	var cgErr error
	if !lateCgroup {
		p.cg, cgErr = r.cgs.podCgroup(p.pod.UID, limit)
	}
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		err = r.n.publishPod(ctx, p.pod, p.inline())
	}()
	if lateCgroup {
		time.Sleep(delay)
		p.cg, cgErr = r.cgs.podCgroup(p.pod.UID, limit)
	}
	<-done
	if cgErr != nil {
		r.t.Errorf("pod %s: its cgroup: %v", p.pod.Name, cgErr)
	}
	late := ""
	if lateCgroup {
		late = fmt.Sprintf(", its cgroup made %v after the publish began", delay)
	}
	if err != nil && p.healthy() {
		r.t.Errorf("healthy pod %s%s: not published within %v: %v", p.pod.Name, late, tenantWithin, err)
	}
	if kind == "healthy" || kind == "attacker" {
		if p.agent, err = r.startAgent(p.cg); err != nil {
			r.t.Errorf("pod %s: starting its process: %v", p.pod.Name, err)
			p.agent = &tenantAgent{dead: true}
		}
	}
	for _, v := range p.vols {
		if v.content {
			p.setSerial(v.Name, readSerial(r.n.k.TargetPath(p.pod, v.Name)))
		}
	}
	return p
}

// newHealthy makes a healthy pod: a token volume, a read-only one, a
// scratch tmpfs.
func (r *tenantRun) newHealthy(lateCgroup bool) *tenantPod {
	vols := []tenantVol{
		{vol("token", "token", tokenSize), true},
		{vol("token-ro", "token", tokenSize), true},
		{vol("scratch", "tmpfs", "1Mi"), false},
	}
	vols[1].ReadOnly = true
	return r.newPod("healthy", vols, healthyLimit, lateCgroup)
}

// Which volumes of a pod an action of the catalogue is done to.
type actsOn int

const (
	onWritable        actsOn = iota // every writable volume (content and scratch)
	onWritableContent               // writable content volumes
	onContent                       // content volumes, writable or not
	onReadOnly                      // read-only volumes
)

func (o actsOn) takes(v tenantVol) bool {
	switch o {
	case onWritable:
		return !v.ReadOnly
	case onWritableContent:
		return !v.ReadOnly && v.content
	case onContent:
		return v.content
	}
	return v.ReadOnly
}

// tenantActions is the catalogue of what an attacking pod does to its
// volumes, by name: each acts on one volume.
var tenantActions = map[string]struct {
	on actsOn
	do func(r *tenantRun, p *tenantPod, v tenantVol, step int) error
}{
	"sparse": {onWritable, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		_, err := p.agent.do(agentOp{Op: "sparse", Path: filepath.Join(r.target(p, v), fmt.Sprintf("huge-%d", step)), N: 1 << 40})
		return err
	}},
	"timestamp-name": {onWritableContent, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		dir := filepath.Join(r.target(p, v), fmt.Sprintf("..2020_01_01_00_00_00.%d", step))
		if _, err := p.agent.do(agentOp{Op: "sparse", Path: filepath.Join(dir, "blob"), N: 1 << 40}); err != nil {
			return err
		}
		_, err := p.agent.do(agentOp{Op: "sparse", Path: filepath.Join(dir, "token"), N: 1 << 30})
		return err
	}},
	"link": {onWritableContent, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		return r.eachFile(p, v, func(name string) error {
			_, err := p.agent.do(agentOp{Op: "link", Path: filepath.Join(r.target(p, v), "..data", name), To: filepath.Join(r.target(p, v), fmt.Sprintf("kept-%d-%s", step, name))})
			return err
		})
	}},
	"hold": {onContent, func(r *tenantRun, p *tenantPod, v tenantVol, _ int) error {
		return r.eachFile(p, v, func(name string) error {
			_, err := p.agent.do(agentOp{Op: "hold", Path: filepath.Join(r.target(p, v), "..data", name)})
			return err
		})
	}},
	"rename-file": {onWritableContent, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		_, err := p.agent.do(agentOp{Op: "rename", Path: filepath.Join(r.target(p, v), "..data", "blob"), To: filepath.Join(r.target(p, v), fmt.Sprintf("moved-%d", step))})
		return err
	}},
	"rename-dir": {onWritableContent, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		ts, err := os.Readlink(filepath.Join(r.target(p, v), "..data"))
		if err != nil {
			return err
		}
		_, err = p.agent.do(agentOp{Op: "rename", Path: filepath.Join(r.target(p, v), ts), To: filepath.Join(r.target(p, v), fmt.Sprintf("moved-dir-%d", step))})
		return err
	}},
	"fill": {onWritable, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		// A part of the volume, or (one in four) the whole of it, or the
		// pod's limit first: its process is OOM-killed, and so again each
		// time it is started while the files are there.
		n := int64(1+r.intn(4)) << 20
		if r.intn(4) == 0 {
			n = 64 << 20
		}
		_, err := p.agent.do(agentOp{Op: "fill", Path: filepath.Join(r.target(p, v), fmt.Sprintf("fill-%d", step)), N: n})
		return err
	}},
	"tree": {onWritable, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		_, err := p.agent.do(agentOp{Op: "tree", Path: filepath.Join(r.target(p, v)), N: 200, M: 2000})
		return err
	}},
	"plant": {onWritableContent, func(r *tenantRun, p *tenantPod, v tenantVol, _ int) error {
		t := r.target(p, v)
		if _, err := p.agent.do(agentOp{Op: "symlink", Path: filepath.Join(t, "..data_tmp"), To: r.outside}); err != nil {
			return err
		}
		_, err := p.agent.do(agentOp{Op: "symlink", Path: filepath.Join(t, "token"), To: filepath.Join(r.outside, "sentinel")})
		return err
	}},
	"write-read-only": {onReadOnly, func(r *tenantRun, p *tenantPod, v tenantVol, step int) error {
		_, err := p.agent.do(agentOp{Op: "sparse", Path: filepath.Join(r.target(p, v), fmt.Sprintf("ro-%d", step)), N: 1 << 40})
		if err == nil {
			r.t.Errorf("pod %s wrote into its read-only volume %s", p.pod.Name, v.Name)
		}
		if errors.Is(err, syscall.EROFS) {
			return nil
		}
		return err
	}},
}

// tenantActionNames is the catalogue's names, in a fixed order (the walk is
// seeded).
var tenantActionNames = func() []string {
	var names []string
	for name := range tenantActions {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}()

// newAttacker makes an attacking pod: a writable bulk volume, sometimes a
// read-only one, a scratch tmpfs, and two to four actions of the catalogue
// it does in the rounds.
func (r *tenantRun) newAttacker() *tenantPod {
	r.mu.Lock()
	vols := []tenantVol{{vol("bulk", "bulk", r.bulkSize()), true}, {vol("scratch", "tmpfs", scratchSize), false}}
	if r.r.IntN(3) == 0 && (r.maxRO < 0 || r.ro < r.maxRO) {
		ro := tenantVol{vol("bulk-ro", "bulk", r.bulkSize()), true}
		ro.ReadOnly = true
		vols = append(vols, ro)
		r.ro++
	}
	var actions []string
	for _, i := range r.r.Perm(len(tenantActionNames))[:2+r.r.IntN(3)] {
		actions = append(actions, tenantActionNames[i])
	}
	r.mu.Unlock()
	p := r.newPod("attacker", vols, attackerLimit, false)
	p.actions = actions
	return p
}

// target is the target path of a pod's volume.
func (r *tenantRun) target(p *tenantPod, v tenantVol) string { return r.n.k.TargetPath(p.pod, v.Name) }

// eachFile calls f with the name of each content file of a rotating
// plugin.
func (r *tenantRun) eachFile(_ *tenantPod, _ tenantVol, f func(name string) error) error {
	var errs []error
	for _, name := range hostile.RotateFiles {
		errs = append(errs, f(name))
	}
	return errors.Join(errs...)
}

// readSerial is the serial of the token of the content volume at target
// (through ..data: the pod may have replaced the file's own name), -1 when
// it cannot be read.
func readSerial(target string) int64 {
	b, err := os.ReadFile(filepath.Join(target, "..data", "token"))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// round is one round of the walk: the attackers' actions, a refresh of
// every content volume, some pods replaced, and the checks.
func (r *tenantRun) round(round int) {
	pods := r.live()
	var wg sync.WaitGroup
	r.attack(pods, 2*round)

	// The refreshes: every content volume of every pod at once, as the
	// kubelet's periodic republish does.
	for _, p := range pods {
		for _, v := range p.vols {
			if v.content {
				wg.Go(func() { r.refresh(p, v) })
			}
		}
	}
	wg.Wait()

	// What the pods do after a refresh is there when the node is checked,
	// and when the driver restarts.
	r.attack(pods, 2*round+1)

	// Healthy pods read their new token themselves.
	for _, p := range pods {
		if p.healthy() {
			for _, v := range p.vols {
				if !v.content {
					continue
				}
				rep, err := p.agent.do(agentOp{Op: "read", Path: filepath.Join(r.target(p, v), "token")})
				if err != nil {
					r.t.Errorf("round %d: healthy pod %s cannot read its token in %s: %v", round, p.pod.Name, v.Name, err)
				} else if f := strings.Fields(rep.Data); len(f) == 0 || f[len(f)-1] != strconv.FormatInt(p.getSerial(v.Name), 10) {
					r.t.Errorf("round %d: healthy pod %s reads the token %q in %s, want serial %d", round, p.pod.Name, rep.Data, v.Name, p.getSerial(v.Name))
				}
			}
		}
	}

	// Pods come and go: a healthy pod replaced, sometimes an attacker.
	var gone []*tenantPod
	r.mu.Lock()
	for _, p := range pods {
		if p.kind == "healthy" && r.r.IntN(4) == 0 || p.kind == "attacker" && r.r.IntN(6) == 0 {
			gone = append(gone, p)
		}
	}
	r.mu.Unlock()
	for _, p := range gone {
		wg.Go(func() {
			r.deletePod(p)
			if p.healthy() {
				r.newHealthy(r.intn(3) == 0)
			} else {
				r.newAttacker()
			}
		})
	}
	wg.Wait()
	if round == r.restartAt {
		// The driver restarted with the pods' files in place: it must count
		// nothing of them (a record is what it counts).
		before, began := r.metric("ephemera_content_held_bytes"), time.Now()
		r.n.restartDriver()
		r.t.Logf("round %d: the driver restarted in %v; content held %s before, %s after", round, time.Since(began).Round(time.Millisecond), mibs(int64(before)), mibs(int64(r.metric("ephemera_content_held_bytes"))))
	}
	r.check(fmt.Sprintf("round %d", round))
}

// attack has each attacking pod do one or two actions of its catalogue, at
// once; step names what they make.
func (r *tenantRun) attack(pods []*tenantPod, step int) {
	var wg sync.WaitGroup
	for _, p := range pods {
		if p.kind != "attacker" {
			continue
		}
		r.mu.Lock()
		acts := slices.Clone(p.actions)
		r.r.Shuffle(len(acts), func(i, j int) { acts[i], acts[j] = acts[j], acts[i] })
		acts = acts[:1+r.r.IntN(min(2, len(acts)))]
		r.mu.Unlock()
		wg.Go(func() {
			if p.agent.gone() {
				// A container the OOM killer ended is restarted (and may
				// be killed again at once: a crash loop).
				if a, err := r.startAgent(p.cg); err == nil {
					p.agent = a
					r.attacked("(restart of the pod's process)", nil)
				}
			}
			for _, name := range acts {
				a := tenantActions[name]
				for _, v := range p.vols {
					if !a.on.takes(v) || r.n.k.State(p.pod, v.Name) != drivertest.StateMounted {
						continue
					}
					err := a.do(r, p, v, step)
					r.attacked(name, err)
					p.mu.Lock()
					p.did = append(p.did, fmt.Sprintf("%d:%s(%s)", step, name, v.Name))
					p.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
}

// live is the live pods of the walk (not the plugin load's).
func (r *tenantRun) live() []*tenantPod {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tenantPod
	for _, p := range r.pods {
		if p.agent != nil {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *tenantPod) int { return strings.Compare(a.pod.Name, b.pod.Name) })
	return out
}

// refresh republishes one content volume: a healthy pod's as the kubelet
// does (retried, within tenantWithin), an attacker's once. An OK answer
// must have refreshed it.
func (r *tenantRun) refresh(p *tenantPod, v tenantVol) {
	if r.n.k.State(p.pod, v.Name) != drivertest.StateMounted {
		return
	}
	target := r.target(p, v)
	before := readSerial(target)
	var err error
	if p.healthy() {
		ctx, cancel := context.WithTimeout(r.n.ctx, tenantWithin)
		var attempts []drivertest.Attempt
		attempts, err = kubeletBackoff.Retry(ctx, func(ctx context.Context) error { return r.n.k.Republish(ctx, p.pod, v.Name) })
		cancel()
		if err != nil {
			r.t.Errorf("healthy pod %s: the refresh of %s not done within %v (%d attempts): %v", p.pod.Name, v.Name, tenantWithin, len(attempts), err)
			return
		}
	} else {
		ctx, cancel := context.WithTimeout(r.n.ctx, operationTimeout+time.Second)
		err = r.n.k.Republish(ctx, p.pod, v.Name)
		cancel()
		r.refreshed(p.kind, err)
		if err != nil {
			if c := status.Code(err); c == codes.Internal || c == codes.Unknown {
				r.t.Errorf("pod %s (it did: %s): the refresh of %s answered %v: %v", p.pod.Name, p.history(), v.Name, c, err)
			}
			// The old content stays (or a newer one, the driver's own
			// retry of the refresh).
			if after := readSerial(target); before >= 0 && after < before {
				r.t.Errorf("pod %s (it did: %s): the refresh of %s failed (%v), and its content went from serial %d to %d", p.pod.Name, p.history(), v.Name, status.Code(err), before, after)
			}
			return
		}
	}
	after := readSerial(target)
	if after <= before {
		r.t.Errorf("pod %s (it did: %s): the refresh of %s answered OK, but its token's serial is %d, %d before: not refreshed", p.pod.Name, p.history(), v.Name, after, before)
	}
	p.setSerial(v.Name, after)
}

func (r *tenantRun) refreshed(kind string, err error) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	if r.refreshes[kind] == nil {
		r.refreshes[kind] = map[codes.Code]int{}
	}
	c := status.Code(err)
	r.refreshes[kind][c]++
	if _, ok := r.worst[c.String()]; !ok && err != nil {
		r.worst[c.String()] = clip(err.Error(), 400)
	}
}

func (r *tenantRun) attacked(name string, err error) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	if r.attacks[name] == nil {
		r.attacks[name] = map[string]int{}
	}
	what := "ok"
	switch {
	case errors.Is(err, errAgentGone):
		what = "pod's process gone"
	case err != nil:
		what = err.Error()
		if i := strings.LastIndex(what, ": "); i >= 0 {
			what = what[i+2:]
		}
	}
	r.attacks[name][what]++
}

// deletePod deletes a pod as the kubelet does: its process killed, its
// volumes torn down (retried), its cgroup removed.
func (r *tenantRun) deletePod(p *tenantPod) {
	if p.agent != nil {
		p.agent.stop()
	}
	// Not the node's context: the plugin load's pods are deleted when it
	// ended too (the driver still runs then).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.n.deletePod(ctx, p.pod, p.inline()); err != nil {
		r.t.Errorf("deleting pod %s: %v", p.pod.Name, err)
		return
	}
	r.mu.Lock()
	delete(r.pods, p.pod.UID)
	for _, v := range p.vols {
		if group(v.InlineVolume) == "bulk" && v.ReadOnly {
			r.ro--
		}
	}
	r.mu.Unlock()
	if p.cg != "" {
		// The pod's processes OOM-killed by its own cgroup: an attacker's
		// may be, a healthy pod's never.
		if kills := p.cg.oomKills(); kills > 0 {
			r.outMu.Lock()
			r.oomKills[p.kind] += kills
			r.outMu.Unlock()
			if p.healthy() {
				r.t.Errorf("healthy pod %s: %d processes of it OOM-killed", p.pod.Name, kills)
			}
		}
		removeCgroupTree(r.t, p.cg.dir())
	}
}

// pluginLoad runs pods of the hostile plugin mode, one after another until
// ctx ends: each published as the kubelet does (retried), kept 500ms,
// deleted.
func (r *tenantRun) pluginLoad(ctx context.Context, mode string) {
	for ctx.Err() == nil {
		p := r.newLoadPod(ctx, mode)
		sleepCtx(ctx, 500*time.Millisecond)
		r.deletePod(p)
	}
}

// newLoadPod is newPod for the plugin load, whose publish may never succeed
// (hang, late): retried until ctx ends.
func (r *tenantRun) newLoadPod(ctx context.Context, mode string) *tenantPod {
	r.mu.Lock()
	r.serial++
	p := &tenantPod{kind: mode, pod: r.n.k.NewPod("tenant", fmt.Sprintf("%s-%d", mode, r.serial)), vols: []tenantVol{{vol("v", mode, hostileSize), true}}}
	r.pods[p.pod.UID] = p
	r.mu.Unlock()
	var err error
	if p.cg, err = r.cgs.podCgroup(p.pod.UID, healthyLimit); err != nil {
		r.t.Errorf("pod %s: its cgroup: %v", p.pod.Name, err)
	}
	_ = r.n.publishPod(ctx, p.pod, p.inline())
	return p
}

// check checks the invariants of the node after a step, retrying those a
// write in flight may make false for a moment (the plugin load runs on).
func (r *tenantRun) check(step string) {
	t := r.t
	drv := r.cgs.driver
	peak, failcnt := drv.value("memory.max_usage_in_bytes"), drv.value("memory.failcnt")
	if plan := r.cfg.plan.bound(r.cfg.mode); peak >= plan {
		t.Errorf("%s: the driver's cgroup peaked at %s, over its memory plan of %s", step, mibs(peak), mibs(plan))
	}
	if failcnt != 0 {
		t.Errorf("%s: the driver's cgroup hit its limit %d times", step, failcnt)
	}
	if r.metric("ephemera_content_held_bytes") < 0 {
		t.Fatalf("%s: the driver does not answer on /metrics (killed?)\n%s", step, r.n.logTail("driver.log", 3000))
	}
	var last string
	var bound int64
	ok := waitFor(time.Second, func() bool {
		last, bound = r.kernelCheck()
		return last == ""
	})
	if !ok {
		t.Errorf("%s: %s", step, last)
	}
	var pods int64
	r.mu.Lock()
	for _, p := range r.pods {
		if p.cg != "" {
			pods += max(p.cg.shmem(), 0)
		}
	}
	r.mu.Unlock()
	t.Logf("%s (%v): driver cgroup %s (peak %s, of it tmpfs %s); content held (metric) %s, the content volumes hold at most %s; the pods' cgroups hold %s of tmpfs", step, time.Since(r.began).Round(10*time.Millisecond),
		mibs(drv.value("memory.usage_in_bytes")), mibs(peak), mibs(drv.shmem()), mibs(int64(r.metric("ephemera_content_held_bytes"))), mibs(bound), mibs(pods))
}

// kernelCheck compares what the driver says with what the kernel says, and
// returns what does not hold ("" when all does), and what the content
// volumes may hold (statfs).
func (r *tenantRun) kernelCheck() (string, int64) {
	held := int64(r.metric("ephemera_content_held_bytes"))
	// What the kernel lets the content volumes hold, and what they use, by
	// pod.
	var bound int64
	used := map[string]int64{}
	r.mu.Lock()
	pods := make([]*tenantPod, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	r.mu.Unlock()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		return err.Error(), 0
	}
	for _, p := range pods {
		for _, v := range p.vols {
			// A target not mounted (yet, or any more) is a directory of the
			// node's filesystem: not the volume's.
			target := r.target(p, v)
			var st unix.Statfs_t
			if mount.MountsAt(infos, target) == 0 || unix.Statfs(target, &st) != nil || st.Type != unix.TMPFS_MAGIC {
				continue
			}
			if v.content {
				bound += int64(st.Blocks)*st.Bsize + int64(st.Files)*content.InodeCharge
			}
			used[p.pod.UID] += int64(st.Blocks-st.Bfree) * st.Bsize
		}
	}
	var problems []string
	if held > bound {
		problems = append(problems, fmt.Sprintf("ephemera_content_held_bytes %s is more than the content volumes can hold (%s, statfs)", mibs(held), mibs(bound)))
	}
	if r.cfg.mode == chargePod && held != 0 {
		problems = append(problems, fmt.Sprintf("ephemera_content_held_bytes %s in pod-cgroup mode, want 0", mibs(held)))
	}
	if shmem := r.cgs.driver.shmem(); shmem > r.shmem0+max(held, 0)+shmemSlack {
		problems = append(problems, fmt.Sprintf("the driver's cgroup holds %s of tmpfs pages, %s when it was ready, and counts %s of content held: %s it does not count",
			mibs(shmem), mibs(r.shmem0), mibs(held), mibs(shmem-r.shmem0-held)))
	}
	if r.cfg.mode == chargePod {
		for _, p := range pods {
			if p.cg == "" {
				continue
			}
			// Every page of the pod's volumes is the pod's (a page or two
			// of slack per volume for a write in progress).
			if sh := p.cg.shmem(); sh >= 0 && sh+int64(len(p.vols))*8<<10 < used[p.pod.UID] {
				problems = append(problems, fmt.Sprintf("pod %s's volumes use %s of memory, its cgroup is charged %s of tmpfs pages", p.pod.Name, mibs(used[p.pod.UID]), mibs(sh)))
			}
		}
	}
	return strings.Join(problems, "; "), bound
}

// teardown deletes every pod, and checks that nothing is left.
func (r *tenantRun) teardown() {
	var wg sync.WaitGroup
	r.mu.Lock()
	var pods []*tenantPod
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	r.mu.Unlock()
	for _, p := range pods {
		wg.Go(func() { r.deletePod(p) })
	}
	wg.Wait()
	r.n.wantClean()
	if held := r.metric("ephemera_content_held_bytes"); held != 0 {
		r.t.Errorf("every pod deleted: ephemera_content_held_bytes is %v, want 0", held)
	}
	if b, err := os.ReadFile(filepath.Join(r.outside, "sentinel")); err != nil || string(b) != "untouched" {
		r.t.Errorf("the file the pods' links pointed at changed: %q, %v", b, err)
	}
	r.check("all pods deleted")
}

// report logs what the walk did.
func (r *tenantRun) report() {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	var attacks []string
	for _, name := range append(slices.Clone(tenantActionNames), "(restart of the pod's process)") {
		if m := r.attacks[name]; m != nil {
			attacks = append(attacks, fmt.Sprintf("%s %v", name, m))
		}
	}
	r.t.Logf("%s: the attacks (what came of them): %s", r.cfg.mode, strings.Join(attacks, "; "))
	r.t.Logf("%s: the attackers' refreshes: %v; e.g. %v", r.cfg.mode, r.refreshes, r.worst)
	r.t.Logf("%s: processes OOM-killed by their pod's cgroup: %v", r.cfg.mode, r.oomKills)
	for _, m := range hostile.ContentModes {
		r.t.Logf("%s: plugin %s's pods' publishes: %v", r.cfg.mode, m, summarize(r.n.led.since(0, "publish", inGroups(string(m)))))
	}
	r.t.Logf("%s: healthy publishes: %v", r.cfg.mode, summarize(r.n.led.since(0, "publish", inGroups("token"))))
}
