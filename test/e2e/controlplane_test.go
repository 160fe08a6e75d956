//go:build e2e && linux

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The control plane beside the API server: kube-controller-manager and
// kube-scheduler run for the whole suite, as on a cluster. Each has its own
// identity (system:kube-controller-manager, system:kube-scheduler: the bootstrap
// RBAC policy's users, which TestStartupTaint's Node,RBAC needs), no leader
// election (one instance; with it, a component that cannot renew its lease
// through an API server outage exits), and a supervisor in the harness that
// starts it again whenever it exits, as systemd or the kubelet's static pods
// would.
//
// What kube-controller-manager now does on its own, and the scenarios count on:
//   - the ServiceAccount "default" and the ConfigMap kube-root-ca.crt (the
//     root-CA publisher, --root-ca-file) in every namespace (ensureNamespace
//     waits for both);
//   - the DaemonSet controller makes a DaemonSet's pods, which kube-scheduler
//     binds (daemonSetPod), and the garbage collector deletes them when their
//     DaemonSet is deleted (deleteDaemonSet); a pod of a DaemonSet deleted alone
//     is made again;
//   - the node lifecycle controller taints a node whose kubelet stops posting
//     its status (node.kubernetes.io/unreachable, after --node-monitor-grace-period,
//     50 s by default) or reports it not Ready (node.kubernetes.io/not-ready),
//     and removes the taints when it is Ready again. Every containerd node has a
//     pod network (writePodNetwork), so that it is Ready at all: without CNI the
//     kubelet reports the node not Ready for good, and the taint manager would
//     evict every pod after the 300 s of the default not-ready toleration.

// component is a control-plane process the harness keeps running: its
// supervisor starts it again (after restartDelay) whenever it exits, until stop.
type component struct {
	c       *cluster
	name    string
	bin     string
	args    []string
	healthz string // https URL answering 200 once it serves

	mu       sync.Mutex
	p        *proc
	restarts int

	quit, done chan struct{}
}

// restartDelay is how long the supervisor waits before it starts an exited
// component again.
const restartDelay = time.Second

// startComponent starts bin under the supervisor and waits until its healthz
// answers 200.
func (c *cluster) startComponent(ctx context.Context, name, bin string, args []string, port int) (*component, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s missing in %s (built by build-k8s.sh; an older EPHEMERA_E2E_K8S_BIN lacks it): %w", name, c.binDir, err)
	}
	k := &component{
		c: c, name: name, bin: bin, args: args,
		healthz: fmt.Sprintf("https://127.0.0.1:%d/healthz", port),
		quit:    make(chan struct{}), done: make(chan struct{}),
	}
	p, err := c.startProc(name, bin, args, nil)
	if err != nil {
		return nil, err
	}
	k.p = p
	go k.supervise()
	if err := k.waitHealthy(ctx); err != nil {
		k.stop()
		return nil, err
	}
	return k, nil
}

func (k *component) supervise() {
	defer close(k.done)
	for {
		k.mu.Lock()
		p := k.p
		k.mu.Unlock()
		select {
		case <-k.quit:
			return
		case <-p.done:
		}
		k.c.logf("%s exited (%v): starting it again in %v", k.name, p.exitErr(), restartDelay)
		select {
		case <-k.quit:
			return
		case <-time.After(restartDelay):
		}
		np, err := k.c.startProc(k.name, k.bin, k.args, nil)
		if err != nil {
			k.c.logf("%s: %v", k.name, err)
			return
		}
		k.mu.Lock()
		k.p = np
		k.restarts++
		k.mu.Unlock()
	}
}

// waitHealthy waits until the component's healthz answers 200 (its serving
// certificate is self-signed; healthz needs no credentials).
func (k *component) waitHealthy(ctx context.Context) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	return waitFor(ctx, 60*time.Second, 100*time.Millisecond, k.name+" healthz", func() (bool, error) {
		resp, err := hc.Get(k.healthz)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// stop ends the supervisor and then the process (SIGTERM, SIGKILL after 10 s).
// It is a no-op on nil.
func (k *component) stop() {
	if k == nil {
		return
	}
	select {
	case <-k.quit:
	default:
		close(k.quit)
	}
	<-k.done
	k.mu.Lock()
	p := k.p
	k.mu.Unlock()
	p.stop(10 * time.Second)
}

// restartCount is how many times the supervisor started the component again.
func (k *component) restartCount() int {
	if k == nil {
		return 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.restarts
}

// startControlPlane starts kube-controller-manager and kube-scheduler, each
// with a kubeconfig of its own user.
func (c *cluster) startControlPlane(ctx context.Context) error {
	t0 := time.Now()
	kubeconfig := func(user, token string) (string, error) {
		p := filepath.Join(c.root, user+".kubeconfig")
		return p, os.WriteFile(p, []byte(c.pki.kubeconfig(c.apiURL, user, token)), 0o600)
	}
	kcmKC, err := kubeconfig("kube-controller-manager", c.pki.ControllerManagerToken)
	if err != nil {
		return err
	}
	schedKC, err := kubeconfig("kube-scheduler", c.pki.SchedulerToken)
	if err != nil {
		return err
	}
	kcmPort, err := freePort()
	if err != nil {
		return err
	}
	schedPort, err := freePort()
	if err != nil {
		return err
	}
	// Every controller kube-controller-manager runs by default (--controllers
	// *: the node lifecycle, DaemonSet, garbage collector, service account,
	// root-CA publisher ... controllers), each with the credentials of its own
	// service account in kube-system, as kubeadm runs it. No cloud provider,
	// no pod CIDRs (no CNI needs them here), no CSR signing (nothing asks for
	// a certificate).
	c.controllerManager, err = c.startComponent(ctx, "kube-controller-manager", filepath.Join(c.binDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + kcmKC,
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + c.pki.SAKey,
		"--root-ca-file=" + c.pki.CAFile,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", kcmPort),
		"--cert-dir=" + filepath.Join(c.root, "pki", "kube-controller-manager-certs"),
		"--profiling=false",
		"--v=2",
	}, kcmPort)
	if err != nil {
		return err
	}
	c.scheduler, err = c.startComponent(ctx, "kube-scheduler", filepath.Join(c.binDir, "kube-scheduler"), []string{
		"--kubeconfig=" + schedKC,
		"--leader-elect=false",
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", schedPort),
		"--cert-dir=" + filepath.Join(c.root, "pki", "kube-scheduler-certs"),
		"--profiling=false",
		"--v=2",
	}, schedPort)
	if err != nil {
		return err
	}
	c.step("kube-controller-manager and kube-scheduler serving", t0)
	return nil
}

// daemonSetPod waits until the DaemonSet controller has made the pod of the
// DaemonSet ns/name for node and kube-scheduler has bound it there, and
// returns it.
func (c *cluster) daemonSetPod(t *testing.T, ns, name, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var pod *corev1.Pod
	err := waitFor(ctx, 60*time.Second, 100*time.Millisecond, "the pod of DaemonSet "+ns+"/"+name+" on "+node, func() (bool, error) {
		d, err := c.cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pods, err := c.daemonSetPods(ctx, d)
		if err != nil {
			return false, err
		}
		for i := range pods {
			if p := &pods[i]; p.Spec.NodeName == node && p.DeletionTimestamp == nil {
				pod = p
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pods of it, none bound to %s", len(pods), node)
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// daemonSetPods lists the pods d controls.
func (c *cluster) daemonSetPods(ctx context.Context, d *appsv1.DaemonSet) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, err
	}
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		return nil, fmt.Errorf("DaemonSet %s: selector %v does not match its template's labels %v", d.Name, d.Spec.Selector, d.Spec.Template.Labels)
	}
	list, err := c.cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == d.UID {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// deleteDaemonSet deletes the DaemonSet ns/name (the garbage collector then
// deletes its pods) and, if wait > 0, waits until every pod it had is gone
// (the kubelet deletes a pod object only once its volumes are torn down). A
// DaemonSet that does not exist is not an error.
func (c *cluster) deleteDaemonSet(t *testing.T, ns, name string, wait time.Duration) {
	t.Helper()
	ctx := context.Background()
	d, err := c.cs.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.daemonSetPods(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	bg := metav1.DeletePropagationBackground
	err = c.cs.AppsV1().DaemonSets(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &d.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if wait > 0 {
		for i := range pods {
			c.waitPodGone(t, &pods[i], wait)
		}
	}
}

// podFromTemplate creates a pod from the current template of the DaemonSet
// ns/name, bound to node, owned by nothing and with labels of its own (the
// DaemonSet would adopt a pod its selector matches): a second node plugin on
// the node, as a DaemonSet left behind would run. Each edit changes it before
// it is created.
func (c *cluster) podFromTemplate(t *testing.T, ns, name, node string, edits ...func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	d, err := c.cs.AppsV1().DaemonSets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: d.Namespace, GenerateName: d.Name + "-left-behind-",
			Labels: map[string]string{"e2e": "left-behind"}, Annotations: d.Spec.Template.Annotations,
		},
		Spec: *d.Spec.Template.Spec.DeepCopy(),
	}
	p.Spec.NodeName = node
	for _, edit := range edits {
		edit(p)
	}
	return c.createPod(t, p)
}
