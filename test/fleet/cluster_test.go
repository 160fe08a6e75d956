//go:build fleet

package fleet

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Identities of the static token file: the admin (setup, /metrics) and a
// kubelet per node. The drivers, the pods' controller and the kube-system
// client authenticate with service-account tokens (TokenRequest) that the
// API server's JWT authenticator checks, as in a cluster.
const (
	adminUser  = "admin"
	nodePrefix = "fleet-node-"
)

// apiServer is etcd and kube-apiserver under one temporary root, with a
// static token per identity.
type apiServer struct {
	t       testing.TB
	root    string
	binDir  string
	url     string
	caFile  string
	tokens  map[string]string // user -> token
	apiArgs []string
	etcd    *exec.Cmd
	etcdURL string // its client URL (plain HTTP, loopback)
	api     *exec.Cmd
	// apiStarted is when the running kube-apiserver was started and
	// apiLogAt where its output begins in kube-apiserver.log (for
	// gcMarks, with GODEBUG=gctrace=1).
	apiStarted time.Time
	apiLogAt   int64
	// cpuGroup, with EPHEMERA_FLEET_APART, is the cgroup (v1 cpu) of the
	// control plane and the kube-system probe: ten times the CPU weight of
	// the simulation's process, as a control plane has cores of its own
	// and the drivers' client work runs on their nodes.
	cpuGroup string
	hc       *http.Client
	pool     *x509.CertPool
}

func findBinaries(t testing.TB, repo string) string {
	if d := os.Getenv("EPHEMERA_E2E_K8S_BIN"); d != "" {
		return d
	}
	cmd := exec.Command("bash", filepath.Join(repo, "test/e2e/build-k8s.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("test/e2e/build-k8s.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startAPIServer writes the PKI and token file, starts etcd and
// kube-apiserver (priority and fairness on, RBAC and Node authorization) and
// waits for /readyz.
func startAPIServer(t testing.TB, binDir string, nodes int) *apiServer {
	root := t.TempDir()
	s := &apiServer{t: t, root: root, binDir: binDir, tokens: map[string]string{}}
	// CA and serving certificate.
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), DNSNames: []string{"localhost", "kubernetes.default"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	s.caFile = filepath.Join(root, "ca.crt")
	writePEM(t, s.caFile, "CERTIFICATE", caDER)
	writePEM(t, filepath.Join(root, "apiserver.crt"), "CERTIFICATE", srvDER)
	kb, _ := x509.MarshalECPrivateKey(srvKey)
	writePEM(t, filepath.Join(root, "apiserver.key"), "EC PRIVATE KEY", kb)
	saKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kb, _ = x509.MarshalECPrivateKey(saKey)
	writePEM(t, filepath.Join(root, "sa.key"), "EC PRIVATE KEY", kb)
	pub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	writePEM(t, filepath.Join(root, "sa.pub"), "PUBLIC KEY", pub)

	// Static tokens: the admin, the drivers' service account, a kube-system
	// client, and a kubelet per node.
	var tf strings.Builder
	add := func(user, groups string) {
		tok := token()
		s.tokens[user] = tok
		fmt.Fprintf(&tf, "%s,%s,%s,\"%s\"\n", tok, user, user, groups)
	}
	add(adminUser, "system:masters")
	for i := range nodes {
		add(nodeUser(i), "system:nodes,system:authenticated")
	}
	tokenFile := filepath.Join(root, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tf.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	if os.Getenv("EPHEMERA_FLEET_APART") != "" {
		s.cpuGroup = controlPlaneGroup(t)
	}
	etcdPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	client := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	s.etcdURL = client
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	s.etcd = s.start("etcd", filepath.Join(binDir, "etcd"), "--name=fleet", "--data-dir="+filepath.Join(root, "etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client, "--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer, "--initial-cluster=fleet="+peer, "--unsafe-no-fsync", "--log-level=warn",
		"--quota-backend-bytes=4294967296")
	s.url = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	s.apiArgs = []string{
		"--etcd-servers=" + client, "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--cert-dir=" + filepath.Join(root, "certs"),
		"--tls-cert-file=" + filepath.Join(root, "apiserver.crt"), "--tls-private-key-file=" + filepath.Join(root, "apiserver.key"),
		"--client-ca-file=" + s.caFile, "--token-auth-file=" + tokenFile,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(root, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(root, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=true",
		// As a small control plane's: 400 + 200 seats in all.
		"--max-requests-inflight=400", "--max-mutating-requests-inflight=200",
		"--disable-admission-plugins=ServiceAccount", "--profiling=false", "--event-ttl=30m", "--v=0",
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	s.pool = pool
	s.hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	s.waitHTTP(client+"/health", "", 30*time.Second)
	s.startAPI()
	t.Cleanup(s.stopAll)
	return s
}

func nodeUser(i int) string { return "system:node:" + nodeName(i) }
func nodeName(i int) string { return fmt.Sprintf("%s%04d", nodePrefix, i) }

func (s *apiServer) start(name, bin string, args ...string) *exec.Cmd {
	log, err := os.OpenFile(filepath.Join(s.root, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH="+goarch())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.join(cmd.Process.Pid)
	go func() { _ = cmd.Wait(); log.Close() }()
	return cmd
}

// controlPlaneGroup makes the cgroup of EPHEMERA_FLEET_APART (cpu.shares
// 10240, the default 1024) and removes it at the end, once its processes
// are gone.
func controlPlaneGroup(t testing.TB) string {
	dir := fmt.Sprintf("/sys/fs/cgroup/cpu/ephemera-fleet-%d", os.Getpid())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("EPHEMERA_FLEET_APART needs the cgroup v1 cpu controller: %v", err)
	}
	// Registered before stopAll, so run after it.
	t.Cleanup(func() {
		for range 50 {
			if err := os.Remove(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte("10240"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// join moves process pid (all its threads) into cpuGroup, if any.
func (s *apiServer) join(pid int) {
	if s.cpuGroup == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(s.cpuGroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		s.t.Fatalf("moving process %d into %s: %v", pid, s.cpuGroup, err)
	}
}

// startAPI starts kube-apiserver and waits for /readyz.
func (s *apiServer) startAPI() {
	s.apiLogAt = 0
	if fi, err := os.Stat(filepath.Join(s.root, "kube-apiserver.log")); err == nil {
		s.apiLogAt = fi.Size()
	}
	s.apiStarted = time.Now()
	s.api = s.start("kube-apiserver", filepath.Join(s.binDir, "kube-apiserver"), s.apiArgs...)
	s.waitHTTP(s.url+"/readyz", s.tokens[adminUser], 90*time.Second)
}

// stopAPI kills kube-apiserver and waits until it is gone.
func (s *apiServer) stopAPI() {
	if s.api == nil || s.api.Process == nil {
		return
	}
	_ = s.api.Process.Signal(syscall.SIGTERM)
	pid := s.api.Process.Pid
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			break
		}
	}
	_ = s.api.Process.Kill()
	s.api = nil
}

func (s *apiServer) stopAll() {
	s.stopAPI()
	if s.etcd != nil && s.etcd.Process != nil {
		_ = s.etcd.Process.Kill()
	}
	time.Sleep(200 * time.Millisecond)
}

func (s *apiServer) waitHTTP(url, tok string, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := s.hc.Do(req)
		if err == nil {
			ok := resp.StatusCode == http.StatusOK
			resp.Body.Close()
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(s.root, "kube-apiserver.log"))
			s.t.Fatalf("%s not ready after %s: %v\n%s", url, d, err, tail(b, 3000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// apiGCMarks are the running kube-apiserver's collections so far (none
// without GODEBUG=gctrace=1).
func (s *apiServer) apiGCMarks() []span {
	b, err := os.ReadFile(filepath.Join(s.root, "kube-apiserver.log"))
	if err != nil || int64(len(b)) < s.apiLogAt {
		return nil
	}
	return gcMarks(b[s.apiLogAt:], s.apiStarted)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// config is a rest.Config of user (a key of the token file).
func (s *apiServer) config(user string, qps float32, burst int) *rest.Config {
	return s.tokenConfig(s.tokens[user], user, qps, burst, false)
}

// tokenConfig is a rest.Config with a bearer token. own gives it a transport
// of its own: its own TCP connection and TLS handshake, as a client in
// another process has (client-go's transport cache shares one HTTP/2
// connection between every config of the same TLS settings whatever their
// tokens, so without it all the simulated clients ride one connection).
func (s *apiServer) tokenConfig(tok, agent string, qps float32, burst int, own bool) *rest.Config {
	cfg := &rest.Config{Host: s.url, BearerToken: tok, QPS: qps, Burst: burst, UserAgent: "fleet-sim/" + strings.ReplaceAll(agent, ":", "-")}
	if own {
		// As client-go's own (utilnet.SetTransportDefaults: HTTP/2 with its
		// health checks), one per client.
		cfg.Transport = utilnet.SetTransportDefaults(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.pool, MinVersion: tls.VersionTLS12}})
	} else {
		cfg.TLSClientConfig = rest.TLSClientConfig{CAFile: s.caFile}
	}
	return cfg
}

// rss returns kube-apiserver's resident set and its peak (VmRSS, VmHWM), in
// bytes, from /proc.
func (s *apiServer) rss() (cur, peak float64) {
	if s.api == nil || s.api.Process == nil {
		return 0, 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.api.Process.Pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		var kb float64
		switch {
		case strings.HasPrefix(l, "VmRSS:"):
			fmt.Sscan(strings.TrimPrefix(l, "VmRSS:"), &kb)
			cur = kb * 1024
		case strings.HasPrefix(l, "VmHWM:"):
			fmt.Sscan(strings.TrimPrefix(l, "VmHWM:"), &kb)
			peak = kb * 1024
		}
	}
	return cur, peak
}

// fds counts kube-apiserver's open file descriptors (its connections among
// them).
func (s *apiServer) fds() float64 {
	if s.api == nil || s.api.Process == nil {
		return 0
	}
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.api.Process.Pid))
	return float64(len(es))
}

// selfRSS is the simulating process's resident set, in bytes.
func selfRSS() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb float64
			fmt.Sscan(v, &kb)
			return kb * 1024
		}
	}
	return 0
}

// selfCPU is the simulating process's user+system CPU seconds.
func selfCPU() float64 { return procCPU("/proc/self/stat") }

// procCPU is the user+system CPU seconds in a /proc/PID/stat file (0 if it
// cannot be read).
func procCPU(statFile string) float64 {
	b, err := os.ReadFile(statFile)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	var ut, st float64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return (ut + st) / 100 // USER_HZ
}

// machineCPU returns the machine's busy and total CPU seconds (every
// process's: /proc/stat's first line, idle and iowait not busy).
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, v := range strings.Fields(line)[1:] {
		var x float64
		fmt.Sscan(v, &x)
		total += x / 100
		if i != 3 && i != 4 { // idle, iowait
			busy += x / 100
		}
	}
	return busy, total
}

func (s *apiServer) admin() kubernetes.Interface {
	cs, err := kubernetes.NewForConfig(s.config(adminUser, 500, 1000))
	if err != nil {
		s.t.Fatal(err)
	}
	return cs
}

// kubectl runs kubectl as the admin.
func (s *apiServer) kubectl(ctx context.Context, args ...string) error {
	kc := filepath.Join(s.root, "admin.kubeconfig")
	if _, err := os.Stat(kc); err != nil {
		cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fleet, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: fleet, context: {cluster: fleet, user: admin}}]
current-context: fleet
`, s.url, s.caFile, s.tokens[adminUser])
		if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", kc}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// metrics returns the API server's /metrics text.
func (s *apiServer) metrics() (string, error) { return s.get("/metrics") }

// get returns the body of an admin's GET of path.
func (s *apiServer) get(path string) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, s.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.tokens[adminUser])
	resp, err := s.hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = io.Copy(&b, resp.Body)
	return b.String(), err
}

// cpuSeconds is kube-apiserver's user+system CPU time, from /proc.
func (s *apiServer) cpuSeconds() float64 {
	if s.api == nil || s.api.Process == nil {
		return 0
	}
	return procCPU(fmt.Sprintf("/proc/%d/stat", s.api.Process.Pid))
}
