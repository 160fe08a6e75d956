//go:build linux

package bench

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// memVolumes is how many pods, one 1Mi tmpfs volume each, TestDriverMemory
// publishes; memNodePods is how many pods the fake API server lists on the
// node (a full node: the kubelet's default maxPods).
const (
	memVolumes  = 1000
	memNodePods = 110
	memNode     = "node-1"
	memDriver   = "scratch.csi.ephemera.dev"
)

// TestDriverMemory measures the scratch driver's memory as a subprocess: VmRSS,
// RssAnon, RssFile and VmHWM from /proc/<pid>/status, idle (with --v=2, as the
// manifests run it) and with 1,000
// published 1Mi tmpfs volumes, at 8 and 64 concurrent publishes, without and
// with the API server components (--events, --gc-confirm-with-api against a
// fake API server that lists 110 pods on the node). /metrics is scraped at
// every reading, as Prometheus would. The driver binary is
// EPHEMERA_BENCH_DRIVER_BIN (make bench-memory passes the image's, make
// build-static) or else a plain go build of ./drivers/scratch.
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestDriverMemory -v
func TestDriverMemory(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 to measure")
	}
	requireRoot(t)
	bin := driverBinary(t)
	if st, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("driver %s: %.1f MB", bin, float64(st.Size())/1e6)
	}

	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "API\tconc\tstate\tVmRSS\tRssAnon\tRssFile\tof it binary\tof it state.db\tVmHWM\tGo heap in use\tGo stacks\tCPU s\twall s")
	for _, withAPI := range []bool{false, true} {
		for _, conc := range []int{8, 64} {
			for _, r := range measureMemory(t, bin, withAPI, conc) {
				fmt.Fprintf(tw, "%v\t%d\t%s\t%.1f MiB\t%.1f MiB\t%.1f MiB\t%.1f MiB\t%.1f MiB\t%.1f MiB\t%.1f MiB\t%.1f MiB\t%.2f\t%.1f\n",
					withAPI, conc, r.state, mib(r.status["VmRSS"]), mib(r.status["RssAnon"]), mib(r.status["RssFile"]),
					mib(r.status["binary"]), mib(r.status["state.db"]), mib(r.status["VmHWM"]), r.goMetrics["go_memstats_heap_inuse_bytes"]/(1<<20),
					r.goMetrics["go_memstats_stack_inuse_bytes"]/(1<<20), r.cpu.Seconds(), r.wall.Seconds())
			}
		}
	}
	_ = tw.Flush()
	t.Logf("memory of the driver (kB from /proc/<pid>/status, in MiB):\n%s", out.String())
}

// reading is the driver's memory after one phase.
type reading struct {
	state     string
	status    map[string]int64   // kB
	goMetrics map[string]float64 // go_memstats_* of /metrics
	cpu       time.Duration      // user+system CPU time of the phase
	wall      time.Duration      // wall time of the phase
}

func mib(kb int64) float64 { return float64(kb) / 1024 }

func measureMemory(t *testing.T, bin string, withAPI bool, conc int) []reading {
	t.Helper()
	base := shortTempDir(t, "ephemera-mem")
	sock := filepath.Join(base, "csi.sock")
	metrics := freeAddr(t)
	args := driverArgs(base, sock, metrics)
	if withAPI {
		args = append(args, "--events", "--gc-confirm-with-api", "--kubeconfig="+fakeAPIServer(t, base))
	}
	pid, stop := startDriverProcess(t, bin, args, base, nil)
	waitReady(t, metrics, base)
	if withAPI {
		waitLog(t, base, "Pod informer synced")
	}

	k := drivertest.NewKubelet(drivertest.KubeletOptions{
		Root: filepath.Join(base, "kubelet"), Endpoint: "unix://" + sock, DriverName: memDriver, NodeName: memNode,
	})
	pods := make([]*drivertest.Pod, memVolumes)
	for i := range pods {
		pods[i] = k.NewPod("mem", "pod-"+strconv.Itoa(i))
	}
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{api.ParamSize: "1Mi"}}
	ctx := context.Background()

	var rs []reading
	phase := func(state string, op func(i int) error) {
		t.Helper()
		cpu0, start := cpuTime(t, pid), time.Now()
		if op != nil {
			if err := parallel(memVolumes, conc, op); err != nil {
				t.Fatalf("%s: %v", state, err)
			}
		}
		wall, cpu := time.Since(start), cpuTime(t, pid)-cpu0
		if op == nil {
			time.Sleep(2 * time.Second)
		}
		st := procStatus(t, pid)
		st["binary"], st["state.db"] = smapsRss(t, pid, bin), smapsRss(t, pid, "state.db")
		rs = append(rs, reading{state: state, status: st, goMetrics: scrape(t, metrics), cpu: cpu, wall: wall})
	}
	phase("idle, 2 s after start", nil)
	phase("1,000 published", func(i int) error { return k.Publish(ctx, pods[i], vol) })
	phase("1,000 republished", func(i int) error { return k.Republish(ctx, pods[i], vol.Name) })
	phase("all unpublished", func(i int) error { return k.DeletePod(ctx, pods[i]) })
	stop()
	return rs
}

// driverArgs are the flags of a scratch driver process under test: its
// socket, kubelet root and state in base, the tmpfs backend, metrics on
// metrics and --v=2, as deploy/base runs it (without the API server).
func driverArgs(base, sock, metrics string) []string {
	return []string{
		"--endpoint=unix://" + sock, "--nodeid=" + memNode, "--driver-name=" + memDriver,
		"--kubelet-root=" + filepath.Join(base, "kubelet"), "--state-dir=" + filepath.Join(base, "state"),
		"--backends=tmpfs", "--metrics-address=" + metrics, "--v=2",
	}
}

// freeAddr is a free 127.0.0.1 port for --metrics-address.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startDriverProcess runs the driver binary bin with args, its output in
// base/driver.log, killed with the test process (Pdeathsig). stop ends it
// (SIGTERM, SIGKILL after 30 s) and is also registered as a cleanup; started,
// when set, runs once the process exists and before that cleanup is
// registered, so the cleanups it registers run after the driver stopped.
func startDriverProcess(t *testing.T, bin string, args []string, base string, started func(pid int)) (pid int, stop func()) {
	t.Helper()
	// A binary just built has dirty pages, which the driver's MADV_PAGEOUT
	// leaves in the page cache (its RSS then reads 3-4 MiB high); on a node
	// the image's binary is clean.
	if f, err := os.Open(bin); err != nil {
		t.Fatal(err)
	} else {
		err = f.Sync()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, args...)
	logf, err := os.Create(filepath.Join(base, "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if started != nil {
		started(cmd.Process.Pid)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	t.Cleanup(stop)
	return cmd.Process.Pid, stop
}

// waitReady waits until the driver's /readyz says ok (its startup reconcile
// is done and it serves).
func waitReady(t *testing.T, addr, base string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(base, "driver.log"))
			t.Fatalf("driver not ready after 30s: %v\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLog waits until the driver's log has line.
func waitLog(t *testing.T, base, line string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		log, err := os.ReadFile(filepath.Join(base, "driver.log"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(log), line) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the driver's log after 30s:\n%s", line, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scrape reads /metrics once, checks that it has the framework's series and
// returns the Go runtime's memory statistics.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(b), "ephemera_volumes{") {
		t.Fatalf("/metrics: %v, %d bytes without ephemera_volumes", err, len(b))
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && strings.HasPrefix(name, "go_memstats_") {
			m[name], _ = strconv.ParseFloat(v, 64)
		}
	}
	return m
}

// procStatus reads the kB fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if fs := strings.Fields(v); ok && len(fs) == 2 && fs[1] == "kB" {
			m[k], _ = strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return m
}

// smapsRss is the resident kB of pid's mappings of files whose path ends in
// suffix (RssFile's share of the binary, of state.db).
func smapsRss(t *testing.T, pid int, suffix string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var kb int64
	match := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			match = len(f) >= 6 && strings.HasSuffix(f[5], suffix)
		case match && len(f) == 3 && f[0] == "Rss:":
			n, _ := strconv.ParseInt(f[1], 10, 64)
			kb += n
		}
	}
	return kb
}

// cpuTime is the user+system CPU time of pid (its threads).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const clkTck = 100 // sysconf(_SC_CLK_TCK) on Linux
	return time.Duration(utime+stime) * time.Second / clkTck
}

// fakeAPIServer serves what the driver's API components ask for: the pods of
// memNode (a list, or a watch that streams them first when asked, as
// kube-apiserver's WatchList does), a watch that then stays open, and event
// writes. Like kube-apiserver it answers in protobuf when the client accepts
// it (client-go's typed clients do for pods), else in JSON; over TLS and
// HTTP/2, with a bearer token. It returns a kubeconfig for it.
func fakeAPIServer(t *testing.T, base string) string {
	t.Helper()
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}, ListMeta: metav1.ListMeta{ResourceVersion: "1000"}}
	for i := range memNodePods {
		list.Items = append(list.Items, nodePod(i))
	}
	bookmark := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{ResourceVersion: list.ResourceVersion,
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
		if strings.Contains(r.Header.Get("Accept"), runtime.ContentTypeProtobuf) {
			info, _ = runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
		}
		q := r.URL.Query()
		// Metadata only, when asked as client-go's metadata clients (and
		// kube.Client) ask: kube-apiserver then sends each pod as a
		// meta.k8s.io/v1 PartialObjectMetadata with its whole metadata.
		metadataOnly := strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadata")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods" && q.Get("watch") == "true":
			object := func(p *corev1.Pod) ([]byte, error) { return runtime.Encode(info.Serializer, p) }
			var write func(*metav1.WatchEvent) error
			if metadataOnly {
				w.Header().Set("Content-Type", "application/json")
				object = func(p *corev1.Pod) ([]byte, error) { return json.Marshal(podMetadata(p)) }
				enc := json.NewEncoder(w)
				write = func(ev *metav1.WatchEvent) error { return enc.Encode(ev) }
			} else {
				w.Header().Set("Content-Type", info.MediaType+";stream=watch")
				enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), info.StreamSerializer.Serializer)
				write = func(ev *metav1.WatchEvent) error { return enc.Encode(ev) }
			}
			send := func(typ watch.EventType, p *corev1.Pod) {
				raw, err := object(p)
				if err == nil {
					err = write(&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: raw}})
				}
				if err != nil {
					t.Errorf("fake API server: watch event: %v", err)
				}
			}
			if q.Get("sendInitialEvents") == "true" {
				for i := range list.Items {
					send(watch.Added, &list.Items[i])
				}
				send(watch.Bookmark, bookmark)
			}
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods" && metadataOnly:
			ml := metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadataList"}, ListMeta: list.ListMeta}
			for i := range list.Items {
				ml.Items = append(ml.Items, podMetadata(&list.Items[i]))
			}
			w.Header().Set("Content-Type", "application/json")
			if err := json.NewEncoder(w).Encode(&ml); err != nil {
				t.Errorf("fake API server: metadata list: %v", err)
			}
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods":
			w.Header().Set("Content-Type", info.MediaType)
			if err := info.Serializer.Encode(&list, w); err != nil {
				t.Errorf("fake API server: list: %v", err)
			}
		case strings.HasSuffix(r.URL.Path, "/events") || strings.Contains(r.URL.Path, "/events/"):
			b, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
			if r.Method == http.MethodPost {
				w.WriteHeader(http.StatusCreated)
			}
			_, _ = w.Write(b)
		default:
			http.NotFound(w, r)
		}
	}))
	// TLS and HTTP/2, as kube-apiserver serves.
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	kubeconfig := filepath.Join(base, "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: driver, user: {token: fake-token}}]
contexts: [{name: fake, context: {cluster: fake, user: driver}}]
current-context: fake
`, srv.URL, base64.StdEncoding.EncodeToString(ca))
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// podMetadata is p as kube-apiserver sends it to a metadata-only request: a
// meta.k8s.io/v1 PartialObjectMetadata with the pod's whole metadata.
func podMetadata(p *corev1.Pod) metav1.PartialObjectMetadata {
	return metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadata"}, ObjectMeta: p.ObjectMeta}
}

// nodePod is a pod of the size of a typical workload pod (two containers with
// env, mounts, probes and resources, its status), about 4 KiB of JSON.
func nodePod(i int) corev1.Pod {
	name := fmt.Sprintf("app-%d-7c9f8d6b5-x%04d", i%20, i)
	var containers []corev1.Container
	for _, c := range []string{"app", "sidecar"} {
		var env []corev1.EnvVar
		for j := range 8 {
			env = append(env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", j), Value: strings.Repeat("v", 24)})
		}
		containers = append(containers, corev1.Container{
			Name: c, Image: "registry.example.com/team/" + c + ":v1.2.3", Env: env,
			Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			VolumeMounts:   []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}, {Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
		})
	}
	return corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "team-" + strconv.Itoa(i%5), UID: types.UID("uid-" + name), ResourceVersion: strconv.Itoa(100 + i),
			Labels:          map[string]string{"app": name[:6], "pod-template-hash": "7c9f8d6b5", "team": "t" + strconv.Itoa(i%5)},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name[:len(name)-6], UID: "uid-rs"}},
		},
		Spec: corev1.PodSpec{
			NodeName: memNode, Containers: containers, ServiceAccountName: "default",
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: memDriver, VolumeAttributes: map[string]string{"size": "1Mi"}}}}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.0.0." + strconv.Itoa(i%250),
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "app", Ready: true, Image: "registry.example.com/team/app:v1.2.3", ContainerID: "containerd://" + strings.Repeat("a", 64)},
				{Name: "sidecar", Ready: true, Image: "registry.example.com/team/sidecar:v1.2.3", ContainerID: "containerd://" + strings.Repeat("b", 64)},
			},
		},
	}
}

// driverBinary is EPHEMERA_BENCH_DRIVER_BIN (make bench and make bench-memory
// pass the image's binary, make build-static), or else the scratch driver built
// here with the Makefile's tags (EPHEMERA_GOTAGS), not stripped.
func driverBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("EPHEMERA_BENCH_DRIVER_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "ephemera-scratch")
	args := []string{"build", "-o", bin}
	if tags := os.Getenv("EPHEMERA_GOTAGS"); tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, "../../drivers/scratch")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
