//go:build e2e && linux

package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	nodeName = "e2e-node"
	// secondNodeName is TestTwoNodes' extra node. Its kubelet token is in the static
	// token file from the start (the API server reads it once).
	secondNodeName    = "e2e-node-b"
	runtimeFake       = "fake"
	runtimeContainerd = "containerd"
)

// cluster is a Kubernetes cluster made of host processes under one run root: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler (controlplane_test.go),
// one node (a container runtime, fake CRI or a private containerd, and the kubelet)
// and the driver under test. The node is embedded: c.kubelet, c.kubeletRoot,
// c.ctr ... are the first node's. TestTwoNodes and TestStartupTaint add a second
// node (addNode).
type cluster struct {
	repoRoot string // the project's module root
	base     string // EPHEMERA_E2E_BASE: parent of run roots
	root     string // this run's root; everything lives below it
	logDir   string
	binDir   string // kubelet, kube-apiserver, kube-controller-manager, kube-scheduler, etcd, fakecri
	// k8sVersion is the kubelet's version ("v1.37.2"), from kubelet --version.
	k8sVersion string
	runtime    string
	// ctrd is the containerd the containerd runtime runs (findContainerd).
	ctrd containerdInstall

	pidMu sync.Mutex
	pki   *pki

	etcdPort, apiPort int
	apiURL            string

	etcd, apiserver *proc
	// Supervised for the whole suite (started again whenever they exit).
	controllerManager, scheduler *component
	// authzMode is kube-apiserver's --authorization-mode: "" is AlwaysAllow;
	// TestStartupTaint restarts it with Node,RBAC (restartAPIServer).
	authzMode string

	node // the first node

	// images
	testbinHost           string // the static test binary on the host
	testImage, pauseImage string

	cs      kubernetes.Interface
	restCfg *rest.Config

	drv *driver

	timingsMu sync.Mutex
	timings   []string
	latencies map[string]latency
}

// node is one Kubernetes node: a kubelet with its own container runtime (a private
// containerd, or the fake CRI), root dir, ports, pod logs and volume plugin dir.
// Every kubelet needs a runtime of its own: its container GC removes the sandboxes
// of pods it does not know, so two kubelets on one runtime would kill each other's
// pods.
type node struct {
	c      *cluster
	name   string // the Node object's name (--hostname-override)
	dir    string // its files: the run root for the first node, <root>/nodes/<x> for others
	suffix string // of its processes' names (and log files): "" for the first node
	token  string // the kubelet's bearer token (system:node:<name>)

	kubeletPort, kubeletHealthzPort int
	cri, kubelet                    *proc
	kubeletArgs                     []string
	// extraKubeletArgs go after the harness's kubelet flags (set before
	// startKubelet; TestStartupTaint: --register-with-taints).
	extraKubeletArgs []string
	// extraKubeletConfig is appended to the KubeletConfiguration (fields the
	// harness does not set; TestGracefulNodeShutdown: the shutdown grace
	// periods), kubeletEnv to the kubelet's environment; set both before
	// startKubelet.
	extraKubeletConfig      string
	kubeletEnv              []string
	kubeletRoot, podLogsDir string
	criEndpoint             string
	// podCgroups is the kubelet's cgroupsPerQOS: true (newNode's default, as on
	// every production node) gives each pod a cgroup of its own, with the QoS
	// levels and the pods' resource limits, below cgroupRoot/kubepods; false
	// (set before startKubelet: TestTwoNodes' node B) leaves the containers
	// where the runtime puts them (containerd: /k8s.io/<container ID>) and no
	// pod has a cgroup, the mode a driver must fall back from.
	podCgroups bool
	// cgroupRoot is the kubelet's cgroupRoot with pod cgroups on: the node's
	// own cgroup below the run's (cgroupRunDir), created by startKubelet.
	cgroupRoot string

	// containerd mode
	ctrSock, runcRoot string
}

// newNode sets up a node's directories and ports; startRuntime and startKubelet
// start it.
func (c *cluster) newNode(name, dir, suffix string) (*node, error) {
	n := &node{
		c: c, name: name, dir: dir, suffix: suffix, token: c.pki.NodeTokens[name],
		kubeletRoot: filepath.Join(dir, "kubelet"),
		podLogsDir:  filepath.Join(dir, "pod-logs"),
		podCgroups:  true,
		cgroupRoot:  cgroupRunDir(c.root) + "/node" + suffix,
	}
	if n.token == "" {
		return nil, fmt.Errorf("no kubelet token for node %s in the PKI", name)
	}
	for _, d := range []string{n.kubeletRoot, n.podLogsDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	for _, p := range []*int{&n.kubeletPort, &n.kubeletHealthzPort} {
		var err error
		if *p, err = freePort(); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (c *cluster) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "e2e %s: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// findRepoRoot walks up from the working directory to the project's go.mod.
func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.Contains(b, []byte("module github.com/ephemera-csi/ephemera\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("project go.mod not found above the working directory")
		}
		dir = parent
	}
}

func newCluster() (*cluster, error) {
	repo, err := findRepoRoot()
	if err != nil {
		return nil, err
	}
	c := &cluster{
		repoRoot:  repo,
		base:      envOr("EPHEMERA_E2E_BASE", "/tmp/ephemera-e2e"),
		runtime:   envOr("EPHEMERA_E2E_RUNTIME", runtimeContainerd),
		latencies: map[string]latency{},
	}
	if c.runtime != runtimeFake && c.runtime != runtimeContainerd {
		return nil, fmt.Errorf("EPHEMERA_E2E_RUNTIME=%q: want fake or containerd", c.runtime)
	}
	return c, nil
}

// cleanLeftovers removes what a crashed earlier run left under the base directory:
// its processes (recorded PIDs, then anything whose command line names its root),
// its mounts (deepest first) and its files.
func cleanLeftovers(base string) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "r") {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if pid, alive := ownerAlive(dir); alive {
			fmt.Fprintf(os.Stderr, "e2e: %s belongs to a running test (pid %d); leaving it alone\n", dir, pid)
			continue
		}
		fmt.Fprintf(os.Stderr, "e2e: cleaning leftover run root %s\n", dir)
		if problems := cleanupRoot(dir); len(problems) > 0 {
			fmt.Fprintf(os.Stderr, "e2e: leftover %s: %v\n", dir, problems)
		}
	}
}

// ownerAlive reports whether the test process that created the run root dir still
// runs (same PID and start time).
func ownerAlive(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "owner"))
	if err != nil {
		return 0, false
	}
	var pid int
	var start string
	if _, err := fmt.Sscanf(string(b), "%d %s", &pid, &start); err != nil || pid == os.Getpid() {
		return pid, false
	}
	st, err := procStartTime(pid)
	return pid, err == nil && st == start
}

// cleanupRoot kills everything belonging to the run root dir, unmounts everything
// below it (deepest first) and removes it.
func cleanupRoot(dir string) []string {
	killRecorded(dir)
	// Every node's containers: the first node's runtime lives in the root, the
	// others' in <root>/nodes/*.
	nodeDirs, _ := filepath.Glob(filepath.Join(dir, "nodes", "*"))
	removeContainers(dir, append([]string{dir}, nodeDirs...)...)
	// Every node's pod cgroups, now that their processes are gone (deepest
	// first; a leftover process of the run is killed).
	problems := removeCgroupTree(cgroupRunDir(dir), false)
	// TestUserNamespaces' pod network, once its pods are gone.
	removePodBridge(dir)
	if failed := unmountAllUnder(dir); len(failed) > 0 {
		problems = append(problems, failed...)
	}
	removeContainerLogLinks(dir)
	// TestExampleFromChart's driver state (the chart refuses a state root in /tmp).
	_ = os.RemoveAll(exampleStateRoot(dir))
	_ = os.Remove(filepath.Dir(exampleStateRoot(dir))) // when no other run uses it
	if err := os.RemoveAll(dir); err != nil {
		problems = append(problems, err.Error())
	}
	return problems
}

// removeContainers deletes the containers that the containerd of each node dir
// (<nodeDir>/containerd, runc root <nodeDir>/runc) started, then kills every
// process whose command line names dir (the shims, and anything else of the run
// left alive) and removes the shims' sockets.
func removeContainers(dir string, nodeDirs ...string) {
	// Let runc delete the containers (kills the container's processes), then kill
	// the shims that reference the root.
	ids := map[string][]os.DirEntry{}
	runc, lookErr := exec.LookPath("runc")
	for _, nd := range nodeDirs {
		runcRoot := filepath.Join(nd, "runc", "k8s.io")
		ids[nd], _ = os.ReadDir(runcRoot)
		if lookErr != nil {
			continue
		}
		for _, id := range ids[nd] {
			_ = exec.Command(runc, "--root", runcRoot, "delete", "--force", id.Name()).Run()
		}
	}
	// The user-namespace handler's containers, with the runc that made them
	// (usernsRuntime); they live in the same containerd, so their shims and
	// sockets are handled with the others' below.
	for _, nd := range nodeDirs {
		bin, err := os.ReadFile(usernsRuncRoot(nd) + ".bin")
		if err != nil {
			continue
		}
		root := filepath.Join(usernsRuncRoot(nd), "k8s.io")
		es, _ := os.ReadDir(root)
		for _, id := range es {
			_ = exec.Command(string(bin), "--root", root, "delete", "--force", id.Name()).Run()
		}
		ids[nd] = append(ids[nd], es...)
	}
	killByCmdline(dir + "/")
	// A SIGKILLed shim leaves its socket in /run/containerd/s (containerd 1.6 puts it
	// there whatever its state dir): unix:///run/containerd/s/<sha256(address/ns/id)>.
	for nd, es := range ids {
		for _, id := range es {
			sum := sha256.Sum256([]byte(filepath.Join(nd, "containerd", "c.sock", "k8s.io", id.Name())))
			_ = os.Remove(filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:])))
		}
	}
}

// removeContainerLogLinks removes the kubelet's symlinks in /var/log/containers (a
// path hard-coded in the kubelet) that point into dir.
func removeContainerLogLinks(dir string) {
	ents, err := os.ReadDir("/var/log/containers")
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join("/var/log/containers", e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, dir+"/") {
			_ = os.Remove(p)
		}
	}
}

func (c *cluster) step(name string, start time.Time) {
	d := time.Since(start)
	c.timingsMu.Lock()
	c.timings = append(c.timings, fmt.Sprintf("%s = %v", name, d.Round(time.Millisecond)))
	c.timingsMu.Unlock()
	c.logf("%s: %v", name, d.Round(time.Millisecond))
}

// start brings the cluster up. On error the caller must still call teardown.
func (c *cluster) start(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the e2e tests must run as root (kubelet, mounts, containerd)")
	}
	if err := os.MkdirAll(c.base, 0o755); err != nil {
		return err
	}
	cleanLeftovers(c.base)
	// Keep the root short: the kubelet's plugin sockets live below it and a unix
	// socket path is limited to 107 bytes.
	root, err := os.MkdirTemp(c.base, "r")
	if err != nil {
		return err
	}
	c.root = root
	// Searchable by all, as /run/containerd is (MkdirTemp makes it 0700): the init
	// of a container in a user namespace (TestUserNamespaces) runs as an unprivileged
	// host ID there and must reach its rootfs below the root.
	if err := os.Chmod(root, 0o711); err != nil {
		return err
	}
	// The owner file lets a concurrent run tell a live root from a crashed one.
	if st, err := procStartTime(os.Getpid()); err == nil {
		_ = os.WriteFile(filepath.Join(root, "owner"), []byte(fmt.Sprintf("%d %s\n", os.Getpid(), st)), 0o644)
	}
	c.logDir = filepath.Join(root, "logs")
	for _, d := range []string{c.logDir, filepath.Join(root, "etcd"), filepath.Join(root, "bin")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	c.logf("run root %s, runtime %s", root, c.runtime)

	t0 := time.Now()
	if err := c.findBinaries(ctx); err != nil {
		return err
	}
	if c.runtime == runtimeContainerd {
		if err := c.findContainerd(ctx); err != nil {
			return err
		}
	}
	if err := c.buildTestbin(ctx); err != nil {
		return err
	}
	c.step("binaries ready", t0)

	bringUp := time.Now()
	if c.pki, err = newPKI(filepath.Join(root, "pki"), nodeName, secondNodeName); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	for _, p := range []*int{&c.etcdPort, &c.apiPort} {
		if *p, err = freePort(); err != nil {
			return err
		}
	}
	first, err := c.newNode(nodeName, root, "")
	if err != nil {
		return err
	}
	c.node = *first
	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	// The node while kube-controller-manager's controllers start (about 5 s
	// before the ServiceAccount default exists).
	if err := c.startRuntime(ctx); err != nil {
		return err
	}
	if err := c.startKubelet(ctx); err != nil {
		return err
	}
	c.step("bring-up (etcd start to node registered)", bringUp)
	t1 := time.Now()
	if err := c.bootstrapObjects(ctx); err != nil {
		return err
	}
	if err := c.waitNodeReady(ctx, nodeName); err != nil {
		return err
	}
	c.step("ServiceAccount default, node Ready and untainted", t1)
	return nil
}

// waitNodeReady waits until the node's Ready condition is True and the node
// lifecycle controller has removed its node.kubernetes.io/not-ready and
// unreachable taints (the TaintNodesByCondition admission plugin puts the first
// on every new Node).
func (c *cluster) waitNodeReady(ctx context.Context, name string) error {
	return waitFor(ctx, 60*time.Second, 200*time.Millisecond, "node "+name+" Ready and untainted", func() (bool, error) {
		n, err := c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, t := range n.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
				return false, fmt.Errorf("taint %s:%s", t.Key, t.Effect)
			}
		}
		for _, cd := range n.Status.Conditions {
			if cd.Type == corev1.NodeReady {
				if cd.Status != corev1.ConditionTrue {
					return false, fmt.Errorf("Ready %s: %s", cd.Status, cd.Message)
				}
				return true, nil
			}
		}
		return false, fmt.Errorf("no Ready condition")
	})
}

// findBinaries runs build-k8s.sh (a no-op when cached) unless EPHEMERA_E2E_K8S_BIN
// names a directory with the binaries.
func (c *cluster) findBinaries(ctx context.Context) error {
	if d := os.Getenv("EPHEMERA_E2E_K8S_BIN"); d != "" {
		c.binDir = d
	} else {
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(c.repoRoot, "test/e2e/build-k8s.sh"))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("test/e2e/build-k8s.sh: %w", err)
		}
		c.binDir = strings.TrimSpace(string(out))
	}
	for _, b := range []string{"kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "fakecri"} {
		if _, err := os.Stat(filepath.Join(c.binDir, b)); err != nil {
			return fmt.Errorf("binary %s missing in %s: %w", b, c.binDir, err)
		}
	}
	out, err := exec.CommandContext(ctx, filepath.Join(c.binDir, "kubelet"), "--version").Output()
	if err != nil {
		return fmt.Errorf("kubelet --version: %w", err)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "Kubernetes ")
	if !ok {
		return fmt.Errorf("kubelet --version: %q, want \"Kubernetes v1.N.P\"", out)
	}
	// K8S_VERSION (make's, which build-k8s.sh builds) must be what runs: an
	// EPHEMERA_E2E_K8S_BIN of another release would silently test that one.
	if want := os.Getenv("K8S_VERSION"); want != "" && want != v {
		return fmt.Errorf("K8S_VERSION=%s, but the kubelet in %s is %s", want, c.binDir, v)
	}
	c.k8sVersion = v
	c.logf("Kubernetes %s (%s)", v, c.binDir)
	return nil
}

// goBuild builds pkg as make build-static builds the image's driver (CGO_ENABLED=0,
// -trimpath, the tags of make's GOTAGS, which it exports as EPHEMERA_GOTAGS), so that
// in make test every package is a build cache hit and only the link runs.
func (c *cluster) goBuild(ctx context.Context, out, pkg string) error {
	return c.goBuildIn(ctx, c.repoRoot, out, pkg)
}

// goBuildIn is goBuild in the module at dir (e.g. an example driver's own module).
func (c *cluster) goBuildIn(ctx context.Context, dir, out, pkg string) error {
	args := []string{"build", "-trimpath"}
	if tags := os.Getenv("EPHEMERA_GOTAGS"); tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "-o", out, pkg)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

func (c *cluster) buildTestbin(ctx context.Context) error {
	c.testbinHost = filepath.Join(c.root, "bin", "testbin")
	return c.goBuild(ctx, c.testbinHost, "./test/e2e/images/testbin")
}

// stopError makes waitFor give up at once (e.g. the awaited process exited).
type stopError struct{ err error }

func (e stopError) Error() string { return e.err.Error() }

// stop wraps err so that waitFor returns it immediately.
func stop(err error) error { return stopError{err} }

// waitFor polls fn every interval until it returns true, or d elapses, or fn
// returns an error wrapped with stop.
func waitFor(ctx context.Context, d, interval time.Duration, what string, fn func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last error
	for {
		ok, err := fn()
		if ok && err == nil {
			return nil
		}
		var stop stopError
		if errors.As(err, &stop) {
			return fmt.Errorf("waiting for %s: %w", what, stop.err)
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("timed out after %v waiting for %s: last error: %v", d, what, last)
			}
			return fmt.Errorf("timed out after %v waiting for %s", d, what)
		case <-time.After(interval):
		}
	}
}

func (c *cluster) startEtcd(ctx context.Context) error {
	peer, err := freePort()
	if err != nil {
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	c.etcd, err = c.startProc("etcd", filepath.Join(c.binDir, "etcd"), []string{
		"--name=e2e", "--data-dir=" + filepath.Join(c.root, "etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=e2e=" + peerURL, "--unsafe-no-fsync", "--log-level=warn",
		"--quota-backend-bytes=2147483648",
	}, []string{"ETCD_UNSUPPORTED_ARCH=" + runtime.GOARCH})
	if err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, 100*time.Millisecond, "etcd health", func() (bool, error) {
		if c.etcd.exited() {
			return false, stop(fmt.Errorf("etcd exited, see %s", c.etcd.logPath))
		}
		resp, err := http.Get(client + "/health")
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return bytes.Contains(b, []byte(`"health":"true"`)), nil
	})
}

func (c *cluster) startAPIServer(ctx context.Context) error {
	var err error
	c.apiURL = fmt.Sprintf("https://127.0.0.1:%d", c.apiPort)
	c.apiserver, err = c.startProc("kube-apiserver", filepath.Join(c.binDir, "kube-apiserver"), []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.etcdPort),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", c.apiPort),
		"--cert-dir=" + filepath.Join(c.root, "pki", "apiserver-certs"),
		"--tls-cert-file=" + c.pki.ServingCert, "--tls-private-key-file=" + c.pki.ServingKey,
		"--client-ca-file=" + c.pki.CAFile,
		"--token-auth-file=" + c.pki.TokenFile,
		"--authorization-mode=" + cmp.Or(c.authzMode, "AlwaysAllow"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.pki.SAPub,
		"--service-account-signing-key-file=" + c.pki.SAKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--allow-privileged=true",
		"--profiling=false",
		"--event-ttl=30m",
		"--v=1",
	}, nil)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(c.pki.CAFile)
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	err = waitFor(ctx, 60*time.Second, 200*time.Millisecond, "kube-apiserver /readyz", func() (bool, error) {
		if c.apiserver.exited() {
			return false, stop(fmt.Errorf("kube-apiserver exited, see %s", c.apiserver.logPath))
		}
		req, _ := http.NewRequest("GET", c.apiURL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.pki.AdminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		return resp.StatusCode == 200, nil
	})
	if err != nil {
		return err
	}
	// For humans debugging a kept run: KUBECONFIG=<root>/admin.kubeconfig kubectl ...
	adminKC := filepath.Join(c.root, "admin.kubeconfig")
	if err := os.WriteFile(adminKC, []byte(c.pki.kubeconfig(c.apiURL, "admin", c.pki.AdminToken)), 0o600); err != nil {
		return err
	}
	c.restCfg = &rest.Config{
		Host:            c.apiURL,
		BearerToken:     c.pki.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.pki.CAFile},
		QPS:             200,
		Burst:           400,
	}
	c.cs, err = kubernetes.NewForConfig(c.restCfg)
	return err
}

// bootstrapObjects waits for what kube-controller-manager makes in the namespace
// default (ensureNamespace) and creates what an operator would: the CSIDriver
// object from deploy/base/csidriver.yaml.
func (c *cluster) bootstrapObjects(ctx context.Context) error {
	if err := c.ensureNamespace(ctx, "default"); err != nil {
		return err
	}
	return c.applyCSIDriver(ctx)
}

// ensureNamespace creates ns (if needed) and waits until kube-controller-manager
// has made its ServiceAccount default (the ServiceAccount admission plugin
// refuses pods without it) and its ConfigMap kube-root-ca.crt (which every
// service-account token volume includes).
func (c *cluster) ensureNamespace(ctx context.Context, ns string) error {
	_, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return waitFor(ctx, 60*time.Second, 100*time.Millisecond, "ServiceAccount default and ConfigMap kube-root-ca.crt in "+ns, func() (bool, error) {
		if _, err := c.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, err
		}
		_, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, err
	})
}

// csiDriverObject decodes deploy/base/csidriver.yaml.
func (c *cluster) csiDriverObject() (*storagev1.CSIDriver, error) {
	f, err := os.Open(filepath.Join(c.repoRoot, "deploy/base/csidriver.yaml"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var d storagev1.CSIDriver
	if err := utilyaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&d); err != nil {
		return nil, fmt.Errorf("decode deploy/base/csidriver.yaml: %w", err)
	}
	if d.Kind != "CSIDriver" || d.Name == "" {
		return nil, fmt.Errorf("deploy/base/csidriver.yaml: not a CSIDriver (kind %q, name %q)", d.Kind, d.Name)
	}
	return &d, nil
}

// applyCSIDriver creates or updates the CSIDriver object from deploy/base.
func (c *cluster) applyCSIDriver(ctx context.Context) error {
	d, err := c.csiDriverObject()
	if err != nil {
		return err
	}
	_, err = c.cs.StorageV1().CSIDrivers().Create(ctx, d, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := c.cs.StorageV1().CSIDrivers().Get(ctx, d.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		d.ResourceVersion = cur.ResourceVersion
		_, err = c.cs.StorageV1().CSIDrivers().Update(ctx, d, metav1.UpdateOptions{})
	}
	return err
}

func (n *node) startRuntime(ctx context.Context) error {
	c := n.c
	t0 := time.Now()
	defer c.step("container runtime ready"+n.suffix, t0)
	if c.runtime == runtimeFake {
		sock := filepath.Join(n.dir, "fakecri.sock")
		n.criEndpoint = "unix://" + sock
		c.testImage, c.pauseImage = testImageRef, pauseImageRef
		var err error
		n.cri, err = c.startProc("fakecri"+n.suffix, filepath.Join(c.binDir, "fakecri"), []string{
			"--endpoint=" + n.criEndpoint, "--images=" + testImageRef + "," + pauseImageRef,
		}, nil)
		if err != nil {
			return err
		}
		return waitFor(ctx, 10*time.Second, 50*time.Millisecond, "fake CRI socket", func() (bool, error) {
			_, err := os.Stat(sock)
			return err == nil, nil
		})
	}
	return n.startContainerd(ctx)
}

func (n *node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: %s
cgroupDriver: cgroupfs
%sfailSwapOn: false
failCgroupV1: false
localStorageCapacityIsolation: false
makeIPTablesUtilChains: false
resolvConf: ""
podLogsDir: %s
volumePluginDir: %s
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.available: "1%%"}
evictionPressureTransitionPeriod: 5s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 24h
syncFrequency: 10s
volumeStatsAggPeriod: 5s
fileCheckFrequency: 20s
nodeStatusUpdateFrequency: 10s
serializeImagePulls: false
maxPods: 200
kubeAPIQPS: 100
kubeAPIBurst: 200
registerNode: true
`, n.kubeletPort, n.kubeletHealthzPort, n.criEndpoint, n.cgroupConfig(), n.podLogsDir, filepath.Join(n.dir, "volume-plugins")) + n.extraKubeletConfig
}

// cgroupConfig is the node's pod cgroup settings of its KubeletConfiguration
// (cgroupDriver is cgroupfs either way, as containerd's runc: SystemdCgroup =
// false). With pod cgroups on, node allocatable is enforced on the pods'
// cgroup (the kubelet's default, enforceNodeAllocatable [pods]); off, it must
// be empty (the kubelet refuses anything else without cgroupsPerQOS).
func (n *node) cgroupConfig() string {
	if !n.podCgroups {
		return "cgroupsPerQOS: false\nenforceNodeAllocatable: []\n"
	}
	return fmt.Sprintf("cgroupsPerQOS: true\ncgroupRoot: %s\nenforceNodeAllocatable: [pods]\n", n.cgroupRoot)
}

func (n *node) startKubelet(ctx context.Context) error {
	c := n.c
	if n.podCgroups {
		// The kubelet refuses to start when its cgroupRoot does not exist.
		if err := makeCgroup(n.cgroupRoot); err != nil {
			return err
		}
		c.logf("kubelet%s: pod cgroups on, cgroupRoot %s", n.suffix, n.cgroupRoot)
	} else {
		c.logf("kubelet%s: pod cgroups off (cgroupsPerQOS: false)", n.suffix)
	}
	cfg := filepath.Join(n.dir, "kubelet-config.yaml")
	if err := os.WriteFile(cfg, []byte(n.kubeletConfig()), 0o644); err != nil {
		return err
	}
	kc := filepath.Join(n.dir, "kubelet.kubeconfig")
	if err := os.WriteFile(kc, []byte(c.pki.kubeconfig(c.apiURL, "kubelet", n.token)), 0o600); err != nil {
		return err
	}
	n.kubeletArgs = []string{
		"--config=" + cfg, "--kubeconfig=" + kc, "--root-dir=" + n.kubeletRoot,
		"--hostname-override=" + n.name, "--v=" + envOr("EPHEMERA_E2E_KUBELET_V", "2"),
	}
	n.kubeletArgs = append(n.kubeletArgs, n.extraKubeletArgs...)
	return n.runKubelet(ctx, true)
}

// runKubelet starts the kubelet and waits until it is healthy (and, the first
// time, until its Node object exists).
func (n *node) runKubelet(ctx context.Context, first bool) error {
	c := n.c
	var err error
	n.kubelet, err = c.startProc("kubelet"+n.suffix, filepath.Join(c.binDir, "kubelet"), n.kubeletArgs, n.kubeletEnv)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: time.Second}
	err = waitFor(ctx, 60*time.Second, 100*time.Millisecond, "kubelet healthz", func() (bool, error) {
		if n.kubelet.exited() {
			return false, stop(fmt.Errorf("kubelet exited, see %s", n.kubelet.logPath))
		}
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.kubeletHealthzPort))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	})
	if err != nil || !first {
		return err
	}
	return waitFor(ctx, 60*time.Second, 100*time.Millisecond, "node "+n.name+" registered", func() (bool, error) {
		if n.kubelet.exited() {
			return false, stop(fmt.Errorf("kubelet exited, see %s", n.kubelet.logPath))
		}
		_, err := c.cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		return err == nil, nil
	})
}

// restartKubelet stops the kubelet with SIGTERM and starts it again with the same
// arguments.
func (n *node) restartKubelet(ctx context.Context) error {
	n.kubelet.stop(15 * time.Second)
	return n.runKubelet(ctx, false)
}

// teardown deletes the test pods (so the kubelet unpublishes their volumes while
// everything still runs), stops every process by PID, unmounts everything below
// the root (deepest first) and removes the root.
func (c *cluster) teardown() {
	if c.root == "" {
		return
	}
	// The controllers first: the DaemonSet controller would make the pods of a
	// DaemonSet a failed test left behind again as they are deleted below.
	c.controllerManager.stop()
	c.scheduler.stop()
	if c.cs != nil && c.kubelet != nil && !c.kubelet.exited() && c.apiserver != nil && !c.apiserver.exited() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := c.deleteAllPods(ctx); err != nil {
			c.logf("teardown: pods not all gone: %v", err)
		}
		cancel()
	}
	if dir := os.Getenv("EPHEMERA_E2E_ARTIFACTS"); dir != "" {
		dst := filepath.Join(dir, filepath.Base(c.root)+"-logs")
		_ = os.MkdirAll(dir, 0o755)
		if err := exec.Command("cp", "-a", c.logDir, dst).Run(); err == nil {
			c.logf("logs copied to %s", dst)
		}
	}
	if c.drv != nil {
		c.drv.stop()
	}
	c.kubelet.stop(10 * time.Second)
	c.cri.stop(10 * time.Second)
	c.apiserver.stop(10 * time.Second)
	c.etcd.stop(10 * time.Second)
	if problems := cleanupRoot(c.root); len(problems) > 0 {
		c.logf("teardown problems: %v", problems)
	} else {
		c.logf("teardown: removed %s", c.root)
	}
}

// deleteAllPods deletes every pod on the node and waits until they are gone from
// the API (the kubelet removes a pod object only after its volumes are torn down).
func (c *cluster) deleteAllPods(ctx context.Context) error {
	pods, err := c.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		_ = c.cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
	}
	return waitFor(ctx, 55*time.Second, 250*time.Millisecond, "all pods gone", func() (bool, error) {
		pods, err := c.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(pods.Items) > 0 {
			return false, fmt.Errorf("%d pods left, e.g. %s/%s", len(pods.Items), pods.Items[0].Namespace, pods.Items[0].Name)
		}
		return true, nil
	})
}

func countInFile(path, needle string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), needle)
}

// dumpLogTails prints the last lines of every component log (for CI output).
func (c *cluster) dumpLogTails() {
	ents, _ := os.ReadDir(c.logDir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(c.logDir, e.Name()))
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		fmt.Fprintf(os.Stderr, "---- tail of %s ----\n%s\n", e.Name(), strings.Join(lines, "\n"))
	}
}

func (c *cluster) printTimings() {
	c.logf("kube-controller-manager started again %d times, kube-scheduler %d times (exits during the run)",
		c.controllerManager.restartCount(), c.scheduler.restartCount())
	c.timingsMu.Lock()
	defer c.timingsMu.Unlock()
	for _, s := range c.timings {
		c.logf("timing: %s", s)
	}
	keys := make([]string, 0, len(c.latencies))
	for k := range c.latencies {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		c.logf("latency %s: %s", k, c.latencies[k])
	}
}
