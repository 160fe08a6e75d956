//go:build e2e && linux

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The shipped image in a real registry: make image's OCI index (linux/amd64,
// linux/arm64, windows/amd64 and their SBOMs), pushed to Debian's docker-registry
// (distribution 2.8.2) serving TLS on loopback with the cluster CA's certificate,
// and pulled by containerd through the kubelet, as on a cluster. containerd trusts
// the registry through a hosts.toml in its config_path (containerdConfig), not by
// an insecure-registry switch.

// registry is the e2e's OCI registry.
type registry struct {
	host string // 127.0.0.1:PORT
	p    *proc
}

var (
	registryOnce sync.Once
	theRegistry  *registry
	registryErr  error
)

// requireRegistry starts the registry on first use and returns it.
func requireRegistry(t *testing.T) *registry {
	t.Helper()
	if clu.runtime != runtimeContainerd {
		t.Skip("pulls an image: EPHEMERA_E2E_RUNTIME=containerd")
	}
	registryOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		theRegistry, registryErr = clu.startRegistry(ctx)
	})
	if registryErr != nil {
		t.Fatalf("registry: %v", registryErr)
	}
	return theRegistry
}

func (c *cluster) startRegistry(ctx context.Context) (*registry, error) {
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		return nil, fmt.Errorf("Debian's docker-registry (distribution 2.8) not found: run test/e2e/install-deps.sh: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &registry{host: fmt.Sprintf("127.0.0.1:%d", port)}
	dir := filepath.Join(c.root, "registry")
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		return nil, err
	}
	// The API server's serving certificate has the SAN 127.0.0.1 and is signed by
	// the cluster CA, which is what containerd and the pusher trust.
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
  tls:
    certificate: %s
    key: %s
`, filepath.Join(dir, "data"), r.host, c.pki.ServingCert, c.pki.ServingKey)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	if r.p, err = c.startProc("registry", bin, []string{"serve", cfgPath}, nil); err != nil {
		return nil, err
	}
	hc, err := c.trustingClient()
	if err != nil {
		return nil, err
	}
	err = waitFor(ctx, 30*time.Second, 100*time.Millisecond, "registry /v2/", func() (bool, error) {
		if r.p.exited() {
			return false, stop(fmt.Errorf("docker-registry exited, see %s", r.p.logPath))
		}
		resp, err := hc.Get("https://" + r.host + "/v2/")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return nil, err
	}
	// containerd's hosts.toml for this registry (config_path/<host>/hosts.toml),
	// read at every pull.
	hosts := fmt.Sprintf(`server = "https://%[1]s"

[host."https://%[1]s"]
  capabilities = ["pull", "resolve"]
  ca = %[2]q
`, r.host, c.pki.CAFile)
	hd := filepath.Join(c.node.registryConfigDir(), r.host)
	if err := os.MkdirAll(hd, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(hd, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		return nil, err
	}
	c.logf("registry %s (docker-registry, TLS with the cluster CA)", r.host)
	return r, nil
}

// registryConfigDir is containerd's registry config_path: one directory per
// registry host with its hosts.toml.
func (n *node) registryConfigDir() string {
	return filepath.Join(n.dir, "containerd", "certs.d")
}

// trustingClient is an HTTP client that trusts the cluster CA.
func (c *cluster) trustingClient() (*http.Client, error) {
	pem, err := os.ReadFile(c.pki.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}, nil
}

// shippedImage is what make image wrote: its OCI layout and the index digest.
type shippedImage struct {
	layout, digest string
}

// requireShippedImage returns make image's output (EPHEMERA_E2E_IMAGE_LAYOUT, and
// the digest in <layout>.digest). In make test the image builds beside the e2e
// (EPHEMERA_E2E_IMAGE_WAIT, a duration): the test waits for the digest file, or
// for <layout>.failed, which the build writes when it fails.
func requireShippedImage(t *testing.T) shippedImage {
	t.Helper()
	layout := os.Getenv("EPHEMERA_E2E_IMAGE_LAYOUT")
	if layout == "" {
		t.Fatal("EPHEMERA_E2E_IMAGE_LAYOUT is not set: run the e2e through make e2e, which builds make image first")
	}
	digestFile := layout + ".digest"
	if w := os.Getenv("EPHEMERA_E2E_IMAGE_WAIT"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			t.Fatalf("EPHEMERA_E2E_IMAGE_WAIT=%q: %v", w, err)
		}
		t0 := time.Now()
		err = waitFor(context.Background(), d, time.Second, "make image beside the e2e ("+digestFile+")", func() (bool, error) {
			if _, err := os.Stat(layout + ".failed"); err == nil {
				return false, stop(fmt.Errorf("make image failed beside the e2e (see _output/beside-e2e.log)"))
			}
			_, err := os.Stat(digestFile)
			return err == nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(t0); waited > 2*time.Second {
			clu.step("waited for make image beside the e2e", t0)
		}
	}
	b, err := os.ReadFile(digestFile)
	if err != nil {
		t.Fatalf("make image's digest: %v", err)
	}
	return shippedImage{layout: layout, digest: strings.TrimSpace(string(b))}
}

// push pushes the image's whole index to the registry as repo:tag with make
// image-push's tool (deploy/images push, trusting the cluster CA) and returns
// repo's full name.
func (r *registry) push(t *testing.T, img shippedImage, repo, tag string) string {
	t.Helper()
	c := clu
	bin := filepath.Join(c.root, "bin", "ephemera-image")
	if _, err := os.Stat(bin); err != nil {
		if err := c.goBuildIn(context.Background(), filepath.Join(c.repoRoot, "deploy", "images"), bin, "."); err != nil {
			t.Fatal(err)
		}
	}
	full := r.host + "/" + repo
	cmd := exec.Command(bin, "push", "-layout", img.layout, "-to", full+":"+tag, "-ca-file", c.pki.CAFile)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("push %s: %v\n%s", full, err, out)
	}
	if !strings.Contains(string(out), "@"+img.digest) {
		t.Fatalf("push %s: %q does not name make image's digest %s", full, out, img.digest)
	}
	return full
}

// waitPodReady waits for the pod's Ready condition.
func (c *cluster) waitPodReady(t *testing.T, p *corev1.Pod, d time.Duration) {
	t.Helper()
	c.waitPod(t, p, d, 100*time.Millisecond, "pod "+p.Name+" Ready", func(cur *corev1.Pod) (bool, error) {
		for _, cond := range cur.Status.Conditions {
			if cond.Type == corev1.PodReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// waitImagePullBackOff waits until the pod's first container waits with reason
// ImagePullBackOff and returns the kubelet's message.
func (c *cluster) waitImagePullBackOff(t *testing.T, p *corev1.Pod, d time.Duration) string {
	t.Helper()
	var msg string
	c.waitPod(t, p, d, 200*time.Millisecond, "pod "+p.Name+" in ImagePullBackOff", func(cur *corev1.Pod) (bool, error) {
		for _, s := range cur.Status.ContainerStatuses {
			if w := s.State.Waiting; w != nil && w.Reason == "ImagePullBackOff" {
				msg = w.Message
				return true, nil
			}
		}
		return false, nil
	})
	return msg
}

// forThisNode changes what a rendered node-plugin DaemonSet needs to run on the
// e2e node, and only that: the host network (no CNI here) with metricsPort for
// the metrics port, and the API server's address in KUBERNETES_SERVICE_HOST/PORT
// (no kube-proxy here to route the kubernetes Service's cluster IP). With
// stateRoot set (kustomize, which has no values), also the host paths: below the
// node's kubelet root and stateRoot instead of /var/lib/kubelet and
// /var/lib/ephemera (in args, mounts and hostPath volumes alike), and with image
// set the driver container's image (what `kustomize edit set image` writes).
// A --kubelet-cgroup-root in the args gets the node's cgroupRoot
// (withKubeletCgroupRoot).
func (c *cluster) forThisNode(ds *unstructured.Unstructured, stateRoot, image string, metricsPort int) error {
	return c.node.forNode(ds, stateRoot, image, metricsPort)
}

// forNode is forThisNode for the node n (its kubelet root and cgroupRoot; the
// caller pins the DaemonSet to n with a nodeSelector).
func (n *node) forNode(ds *unstructured.Unstructured, stateRoot, image string, metricsPort int) error {
	c := n.c
	spec, ok, err := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	if err != nil || !ok {
		return fmt.Errorf("DaemonSet %s: no pod template (%v)", ds.GetName(), err)
	}
	if stateRoot != "" {
		repl := strings.NewReplacer("/var/lib/kubelet", n.kubeletRoot, "/var/lib/ephemera", stateRoot,
			":9809", fmt.Sprintf(":%d", metricsPort))
		spec = replaceStrings(spec, repl).(map[string]any)
	}
	spec["hostNetwork"] = true
	containers, _ := spec["containers"].([]any)
	found := false
	for _, ci := range containers {
		ctn := ci.(map[string]any)
		if ctn["name"] != "driver" {
			continue
		}
		found = true
		if image != "" {
			ctn["image"] = image
		}
		if ports, ok := ctn["ports"].([]any); ok {
			for _, pi := range ports {
				if p := pi.(map[string]any); p["name"] == "metrics" {
					p["containerPort"] = int64(metricsPort)
				}
			}
		}
		env, _ := ctn["env"].([]any)
		ctn["env"] = append(env,
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": fmt.Sprint(c.apiPort)})
	}
	if !found {
		return fmt.Errorf("DaemonSet %s: no container named driver", ds.GetName())
	}
	if err := unstructured.SetNestedMap(ds.Object, spec, "spec", "template", "spec"); err != nil {
		return err
	}
	return n.withKubeletCgroupRoot(ds)
}

// withKubeletCgroupRoot sets the value of every --kubelet-cgroup-root flag in
// the args of a rendered DaemonSet's containers to the node's
// cgroupRoot, as an operator sets it to the kubelet's --cgroup-root: the
// manifests say "/", the default, where no kubelet of the harness keeps its
// pods (see "Pod cgroups" in README.md). A DaemonSet without the flag is
// left as it is.
func (n *node) withKubeletCgroupRoot(ds *unstructured.Unstructured) error {
	if !n.podCgroups {
		return nil
	}
	containers, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return fmt.Errorf("DaemonSet %s: %w", ds.GetName(), err)
	}
	for _, ci := range containers {
		ctn, _ := ci.(map[string]any)
		args, _ := ctn["args"].([]any)
		for i, a := range args {
			s, _ := a.(string)
			if strings.HasPrefix(s, "--kubelet-cgroup-root=") {
				args[i] = "--kubelet-cgroup-root=" + n.cgroupRoot
			} else if s == "--kubelet-cgroup-root" && i+1 < len(args) {
				args[i+1] = n.cgroupRoot
			}
		}
	}
	return unstructured.SetNestedSlice(ds.Object, containers, "spec", "template", "spec", "containers")
}

// replaceStrings applies r to every string in v (maps and lists of an
// unstructured object).
func replaceStrings(v any, r *strings.Replacer) any {
	switch v := v.(type) {
	case string:
		return r.Replace(v)
	case map[string]any:
		for k, e := range v {
			v[k] = replaceStrings(e, r)
		}
	case []any:
		for i, e := range v {
			v[i] = replaceStrings(e, r)
		}
	}
	return v
}
