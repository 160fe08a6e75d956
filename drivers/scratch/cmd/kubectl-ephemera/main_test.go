package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// fakeAPI answers the pod list and the pod proxy as kube-apiserver does, for
// two driver pods (node-1, node-2; a third is Pending), and records requests.
func fakeAPI(t *testing.T, forbidProxy bool) (kubeconfig string, seen func() []string) {
	return fakeAPIWith(t, forbidProxy, false)
}

// fakeAPIWith is fakeAPI whose driver pods answer 404 (a driver with
// --volumes-endpoint=false) when volumesOff.
func fakeAPIWith(t *testing.T, forbidProxy, volumesOff bool) (kubeconfig string, seen func() []string) {
	t.Helper()
	var mu sync.Mutex
	var reqs []string
	list := func(node string) api.VolumeList {
		return api.VolumeList{Driver: "scratch.csi.ephemera.dev", Node: node, Volumes: []api.VolumeInfo{{
			VolumeID: "csi-" + node, Pod: api.Pod{Namespace: "team-a", Name: "web", UID: "uid-" + node}, VolumeName: "scratch",
			Backend: "tmpfs", Size: 64 << 20, Phase: string(store.PhasePublished), Mounted: true, Created: time.Now().Add(-time.Hour),
		}}}
	}
	// TLS: clientcmd sends credentials to https servers only.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reqs = append(reqs, r.URL.Path+"?"+r.URL.RawQuery+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/namespaces/kube-system/pods":
			items := ""
			for i, n := range []string{"node-1", "node-2", "node-3"} {
				phase := "Running"
				if n == "node-3" {
					phase = "Pending"
				}
				if sel := r.URL.Query().Get("fieldSelector"); sel != "" && sel != "spec.nodeName="+n {
					continue
				}
				if items != "" {
					items += ","
				}
				items += fmt.Sprintf(`{"metadata":{"name":"ephemera-scratch-node-%d","namespace":"kube-system"},"spec":{"nodeName":%q},"status":{"phase":%q}}`, i, n, phase)
			}
			fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[%s]}`, items)
		case "/api/v1/namespaces/kube-system/pods/ephemera-scratch-node-0:9809/proxy/volumes",
			"/api/v1/namespaces/kube-system/pods/ephemera-scratch-node-1:9809/proxy/volumes":
			if forbidProxy {
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"x\" is forbidden: User \"alice\" cannot get resource \"pods/proxy\"","reason":"Forbidden","code":403}`)
				return
			}
			if volumesOff { // the driver's mux, through the proxy
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintln(w, "404 page not found")
				return
			}
			node := map[string]string{"ephemera-scratch-node-0:9809": "node-1", "ephemera-scratch-node-1:9809": "node-2"}[strings.Split(r.URL.Path, "/")[6]]
			_ = json.NewEncoder(w).Encode(list(node))
		default:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
		}
	}))
	t.Cleanup(srv.Close)
	kubeconfig = writeKubeconfig(t, srv)
	return kubeconfig, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), reqs...)
	}
}

// writeKubeconfig writes a kubeconfig of srv with the token secret-token.
func writeKubeconfig(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: %q
    certificate-authority-data: %s
users:
- name: u
  user:
    token: secret-token
contexts:
- name: ctx
  context:
    cluster: c
    user: u
current-context: ctx
`, srv.URL, base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

func TestVolumesThroughThePodProxy(t *testing.T) {
	kubeconfig, seen := fakeAPI(t, false)
	var out, errb bytes.Buffer
	if code := run([]string{"volumes", "--kubeconfig", kubeconfig}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NODE ") ||
		strings.Join(strings.Fields(lines[1])[:7], " ") != "node-1 csi-node-1 team-a web scratch tmpfs 64Mi" ||
		!strings.HasPrefix(lines[2], "node-2 ") {
		t.Errorf("table:\n%s", out.String())
	}
	reqs := seen()
	slices.Sort(reqs[1:]) // the pods are asked concurrently
	want := []string{
		"/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io%2Fname%3Dephemera-scratch Bearer secret-token",
		"/api/v1/namespaces/kube-system/pods/ephemera-scratch-node-0:9809/proxy/volumes? Bearer secret-token",
		"/api/v1/namespaces/kube-system/pods/ephemera-scratch-node-1:9809/proxy/volumes? Bearer secret-token",
	}
	if strings.Join(reqs, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests\n%s\nwant\n%s", strings.Join(reqs, "\n"), strings.Join(want, "\n"))
	}

	out.Reset()
	if code := run([]string{"volumes", "--kubeconfig", kubeconfig, "--node", "node-2", "-o", "json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got []nodeVolumes
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got) != 1 || got[0].Node != "node-2" || got[0].Volumes == nil ||
		len(got[0].Volumes.Volumes) != 1 || got[0].Volumes.Volumes[0].VolumeID != "csi-node-2" {
		t.Errorf("json: %v\n%s", err, out.String())
	}

	errb.Reset()
	if code := run([]string{"volumes", "--kubeconfig", kubeconfig, "--node", "node-3"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "no running driver pod") {
		t.Errorf("a node without a running driver: %d %q", code, errb.String())
	}
	// -o wide adds the pod UIDs (and the targets).
	out.Reset()
	if code := run([]string{"volumes", "--kubeconfig", kubeconfig, "-o", "wide"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], " POD UID ") ||
		strings.Join(strings.Fields(lines[1])[:8], " ") != "node-1 csi-node-1 team-a web uid-node-1 scratch tmpfs 64Mi" {
		t.Errorf("wide table:\n%s", out.String())
	}
}

func TestVolumesProxyForbidden(t *testing.T) {
	kubeconfig, _ := fakeAPI(t, true)
	var out, errb bytes.Buffer
	code := run([]string{"volumes", "--kubeconfig", kubeconfig, "--node", "node-1"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "403 Forbidden") || !strings.Contains(errb.String(), "RBAC: get on pods/proxy in kube-system") {
		t.Errorf("forbidden: %d %q", code, errb.String())
	}
	if strings.Contains(errb.String(), "secret-token") {
		t.Error("the token in an error")
	}
}

// A driver that does not serve /volumes (--volumes-endpoint=false) is named
// as such, not taken for a missing pod.
func TestVolumesEndpointOff(t *testing.T) {
	kubeconfig, _ := fakeAPIWith(t, false, true)
	var out, errb bytes.Buffer
	code := run([]string{"volumes", "--kubeconfig", kubeconfig, "--node", "node-1"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "404 Not Found") || !strings.Contains(errb.String(), "--volumes-endpoint=false") {
		t.Errorf("volumes endpoint off: %d %q", code, errb.String())
	}
}

func TestUsage(t *testing.T) {
	var out, errb bytes.Buffer
	// No command: the command list, on stderr, exit 2.
	if code := run(nil, &out, &errb); code != 2 || out.Len() != 0 || !strings.Contains(errb.String(), "Commands:\n  volumes") || !strings.Contains(errb.String(), "\n  version") {
		t.Errorf("no command: %d %q", code, errb.String())
	}
	// Asked for: on stdout, exit 0.
	for _, arg := range []string{"help", "-h", "--help"} {
		out.Reset()
		errb.Reset()
		if code := run([]string{arg}, &out, &errb); code != 0 || errb.Len() != 0 || !strings.Contains(out.String(), "Commands:\n  volumes") {
			t.Errorf("%s: %d %q %q", arg, code, out.String(), errb.String())
		}
	}
	errb.Reset()
	if code := run([]string{"volume"}, &bytes.Buffer{}, &errb); code != 2 || !strings.HasPrefix(errb.String(), `unknown command "volume"`) || !strings.Contains(errb.String(), "Commands:") {
		t.Errorf("unknown command: %d %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"volumes", "-h"}, &bytes.Buffer{}, &errb); code != 2 || !strings.Contains(errb.String(), "kubectl ephemera volumes") || !strings.Contains(errb.String(), "-concurrency") {
		t.Errorf("volumes -h: %d %q", code, errb.String())
	}
	if code := run([]string{"volumes", "-o", "yaml"}, &bytes.Buffer{}, &errb); code != 2 {
		t.Errorf("-o yaml: %d", code)
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		var out, errb bytes.Buffer
		if code := run([]string{arg}, &out, &errb); code != 0 || errb.Len() != 0 {
			t.Fatalf("%s: %d %q", arg, code, errb.String())
		}
		if want := "kubectl-ephemera " + version + "\ngit commit: "; !strings.HasPrefix(out.String(), want) || !strings.Contains(out.String(), "\ngo: go") {
			t.Errorf("%s:\n%s\nwant the prefix %q and the Go version", arg, out.String(), want)
		}
	}
}

// With no kubeconfig anywhere the plugin says so in its own words, not
// client-go's KUBERNETES_MASTER text.
func TestNoKubeconfig(t *testing.T) {
	// client-go reads ~/.kube/config from $HOME as it was at start.
	if _, err := os.Stat(clientcmd.RecommendedHomeFile); err == nil {
		t.Skipf("%s exists", clientcmd.RecommendedHomeFile)
	}
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	var errb bytes.Buffer
	code := run([]string{"volumes"}, &bytes.Buffer{}, &errb)
	if code != 1 || !strings.HasPrefix(errb.String(), "no kubeconfig: none at --kubeconfig, $KUBECONFIG or "+clientcmd.RecommendedHomeFile) ||
		strings.Contains(errb.String(), "KUBERNETES_MASTER") {
		t.Errorf("no kubeconfig: %d %q", code, errb.String())
	}
}

// fleetAPI serves n running driver pods (node-000 ...); proxy answers each
// pod's /volumes (node is the pod's node).
func fleetAPI(t *testing.T, n int, proxy func(w http.ResponseWriter, r *http.Request, node string)) string {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/namespaces/kube-system/pods" {
			var items []string
			for i := range n {
				items = append(items, fmt.Sprintf(`{"metadata":{"name":"d-%03d"},"spec":{"nodeName":"node-%03d"},"status":{"phase":"Running"}}`, i, i))
			}
			fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[%s]}`, strings.Join(items, ","))
			return
		}
		// /api/v1/namespaces/kube-system/pods/d-NNN:9809/proxy/volumes
		parts := strings.Split(r.URL.Path, "/")
		if len(parts) != 9 || parts[7] != "proxy" || parts[8] != "volumes" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		proxy(w, r, "node-"+strings.TrimSuffix(strings.TrimPrefix(parts[6], "d-"), ":9809"))
	}))
	t.Cleanup(srv.Close)
	return writeKubeconfig(t, srv)
}

func answer(w http.ResponseWriter, node string) {
	_ = json.NewEncoder(w).Encode(api.VolumeList{Driver: "scratch.csi.ephemera.dev", Node: node, Volumes: []api.VolumeInfo{{
		VolumeID: "csi-" + node, Pod: api.Pod{Namespace: "team-a", Name: "web", UID: "uid-" + node}, VolumeName: "scratch",
		Backend: "tmpfs", Size: 64 << 20, Phase: string(store.PhasePublished), Mounted: true, Created: time.Now(),
	}}})
}

// The driver pods are asked concurrently, never more than --concurrency at
// once, and every node is listed in the pods' order.
func TestVolumesFanOut(t *testing.T) {
	const pods, limit = 40, 4
	var inFlight, most atomic.Int32
	kubeconfig := fleetAPI(t, pods, func(w http.ResponseWriter, r *http.Request, node string) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond) // a driver pod's answer through the proxy
		answer(w, node)
	})
	var out, errb bytes.Buffer
	start := time.Now()
	if code := run([]string{"volumes", "--kubeconfig", kubeconfig, "--concurrency", fmt.Sprint(limit), "-o", "json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	elapsed := time.Since(start)
	var got []nodeVolumes
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got) != pods {
		t.Fatalf("json (%v): %d nodes, want %d", err, len(got), pods)
	}
	for i, nv := range got {
		if want := fmt.Sprintf("node-%03d", i); nv.Node != want || nv.Volumes == nil || nv.Volumes.Node != want || nv.Error != "" {
			t.Errorf("answer %d: %+v, want %s's own", i, nv, want)
		}
	}
	// At most limit at once; and more than one (40 answers of 20ms one by one
	// would be 800ms: the pods are asked concurrently).
	if m := most.Load(); m > limit || m < 2 {
		t.Errorf("at most %d driver pods asked at once, want 2..%d", m, limit)
	}
	t.Logf("%d pods, --concurrency %d: at most %d at once, %v", pods, limit, most.Load(), elapsed)
}

// A driver pod that never answers costs its own --pod-timeout, not the
// command's: every other node is still listed, and the silent one named.
//
// The pod timeout bounds the healthy pods' answers too, each of which may
// need a TLS connection of its own: with -race on a loaded machine those took
// longer than 300 ms (test-flakes), so it is 3 s; the test takes that long.
func TestVolumesHangingPod(t *testing.T) {
	kubeconfig := fleetAPI(t, 5, func(w http.ResponseWriter, r *http.Request, node string) {
		if node == "node-001" {
			<-r.Context().Done() // until the client gives up
			// No answer at all. Returning would make net/http complete the
			// request as an empty 200, an answer a silent pod never gives.
			panic(http.ErrAbortHandler)
		}
		answer(w, node)
	})
	var out, errb bytes.Buffer
	code := run([]string{"volumes", "--kubeconfig", kubeconfig, "--concurrency", "2", "--pod-timeout", "3s", "--timeout", "30s"}, &out, &errb)
	if code != 1 {
		t.Errorf("exit %d, want 1 (a node did not answer)", code)
	}
	if !strings.Contains(errb.String(), "node node-001: pod d-001:") || !strings.Contains(errb.String(), "deadline exceeded") || strings.Count(errb.String(), "node ") != 1 {
		t.Errorf("stderr %q: want node-001 named (deadline exceeded), and only it", errb.String())
	}
	for _, n := range []string{"node-000", "node-002", "node-003", "node-004"} {
		if !strings.Contains(out.String(), n+" ") {
			t.Errorf("table lacks %s:\n%s", n, out.String())
		}
	}
}

func TestVolumesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"volumes", "--concurrency", "0"}, {"volumes", "--pod-timeout", "0s"}} {
		var errb bytes.Buffer
		if code := run(args, &bytes.Buffer{}, &errb); code != 2 || !strings.Contains(errb.String(), "want at least 1") {
			t.Errorf("%v: %d %q", args, code, errb.String())
		}
	}
}
