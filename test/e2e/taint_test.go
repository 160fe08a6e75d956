//go:build e2e && linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

const (
	taintNS     = "startup-taint"
	startupKey  = "ephemera.dev/scratch-not-ready"
	driverSA    = "ephemera-scratch-node"
	nodeNameKey = "authentication.kubernetes.io/node-name"
)

// restartAPIServer restarts kube-apiserver with --authorization-mode=mode ("":
// AlwaysAllow) on the same etcd, port and PKI; the kubelets and drivers reconnect.
func (c *cluster) restartAPIServer(ctx context.Context, mode string) error {
	// SIGKILL after a short grace: its graceful shutdown takes half a minute, and
	// everything it has is in etcd.
	c.apiserver.stop(2 * time.Second)
	c.authzMode = mode
	return c.startAPIServer(ctx)
}

// TestStartupTaint: issue 34, item 6. With RBAC on (--authorization-mode=Node,RBAC)
// and the driver on a bound service account token with only the RBAC of deploy/
// (deploy/base/rbac.yaml and deploy/components/startup-taint), a second node
// registers with the startup taint (kubelet --register-with-taints); a pod that
// uses the driver and must run there (nodeSelector) stays Pending, unscheduled by
// a real kube-scheduler, with no mount attempt; the driver starts, the kubelet
// registers it, the driver removes the taint, and the pod is scheduled and starts
// on its first NodePublishVolume, with no FailedMount. Then the admission policy:
// the same token may not change another node, a label, another taint, nor set
// the node's pod CIDRs or provider ID (which the API server lets be set once
// while empty).
func TestStartupTaint(t *testing.T) {
	c := clu
	drvA := requireDriver(t)
	ctx := context.Background()
	start := time.Now()

	// RBAC on for this test only; the cleanup that restores AlwaysAllow runs last.
	if err := c.restartAPIServer(ctx, "Node,RBAC"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.restartAPIServer(context.Background(), ""); err != nil {
			t.Errorf("restoring AlwaysAllow: %v", err)
		}
	})
	t.Logf("kube-apiserver restarted with Node,RBAC in %v", time.Since(start).Round(time.Millisecond))
	if err := c.ensureNamespace(ctx, taintNS); err != nil {
		t.Fatal(err)
	}

	// deploy/'s RBAC and the component's policy, as shipped.
	var objs []*unstructured.Unstructured
	for _, f := range []string{"deploy/base/serviceaccount.yaml", "deploy/base/rbac.yaml", "deploy/components/startup-taint/rbac.yaml", "deploy/components/startup-taint/policy.yaml"} {
		o, err := readObjects(filepath.Join(c.repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	a := c.newApplier(t)
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			o.SetNamespace("kube-system")
		}
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", describe(o), err)
		}
	}
	t.Cleanup(func() {
		for _, o := range objs {
			if err := a.delete(context.Background(), o); err != nil {
				t.Errorf("delete %s: %v", describe(o), err)
			}
		}
	})

	// The node, tainted at registration by its kubelet.
	b, err := c.newNode(secondNodeName, filepath.Join(c.root, "nodes", "t"), "-t")
	if err != nil {
		t.Fatal(err)
	}
	b.extraKubeletArgs = []string{"--register-with-taints=" + startupKey + "=:NoSchedule"}
	var drvB *driver
	t.Cleanup(func() { b.remove(t, drvB, taintNS) })
	if err := c.addNode(ctx, b); err != nil {
		t.Fatal(err)
	}
	if !hasTaint(t, c, b.name) {
		t.Fatalf("node %s registered without the taint %s", b.name, startupKey)
	}

	// The driver's identity: its pod on the node (bound service account token).
	idPod := c.newPod("kube-system", "ephemera-scratch-node-t", memoryEmptyDir("d"), nil)
	idPod.Spec.NodeName = b.name
	idPod.Spec.ServiceAccountName = driverSA
	idPod.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	idPod = c.createPod(t, idPod)
	t.Cleanup(func() {
		zero := int64(0)
		_ = c.cs.CoreV1().Pods("kube-system").Delete(context.Background(), idPod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	tr, err := c.cs.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, driverSA, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptrTo(int64(3600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: idPod.Name, UID: idPod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(b.dir, "driver.kubeconfig")
	if err := os.WriteFile(kc, []byte(c.pki.kubeconfig(c.apiURL, driverSA, tr.Status.Token)), 0o600); err != nil {
		t.Fatal(err)
	}
	sa := saClient(t, kc)
	who, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := who.Status.UserInfo; u.Username != "system:serviceaccount:kube-system:"+driverSA || !slices.Equal(u.Extra[nodeNameKey], authenticationv1.ExtraValue{b.name}) {
		t.Fatalf("the token is %s with %s=%v, want the driver's service account bound to node %s", u.Username, nodeNameKey, u.Extra[nodeNameKey], b.name)
	}
	// RBAC is what the driver uses: list (its informer), never get, on pods.
	if _, err := sa.CoreV1().Pods("kube-system").Get(ctx, idPod.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("get pod with the driver's token: %v, want Forbidden (the ClusterRole grants list and watch only)", err)
	}

	// A pod that must run on the tainted node: Pending, unscheduled, no mount tried.
	vol := tmpfsVolume("v", "4Mi")
	p := c.newPod(taintNS, "waits-for-driver", vol, steps(st("write", "/data/f", "4096"), st("pause")))
	p.Spec.NodeName = ""
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": b.name}
	// The not-ready taint: see scheduledPod. Nothing tolerates the startup taint.
	p.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	p = c.createPod(t, p)
	c.waitPod(t, p, 30*time.Second, 200*time.Millisecond, "the scheduler finds no node for the pod", func(cur *corev1.Pod) (bool, error) {
		for _, cd := range cur.Status.Conditions {
			if cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionFalse && cd.Reason == corev1.PodReasonUnschedulable {
				// 1.37's message does not name the taint: the node's only
				// untolerated one is the startup taint (checked below).
				if !strings.Contains(cd.Message, "untolerated taint") {
					return false, stop(fmt.Errorf("unschedulable for another reason: %s", cd.Message))
				}
				return true, nil
			}
		}
		return false, nil
	})
	var untolerated []string
	for _, x := range mustNode(t, c, b.name).Spec.Taints {
		if !slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &x, false) }) {
			untolerated = append(untolerated, x.Key)
		}
	}
	if !slices.Equal(untolerated, []string{startupKey}) {
		t.Fatalf("node %s's taints the pod does not tolerate: %q, want only %s", b.name, untolerated, startupKey)
	}
	time.Sleep(3 * time.Second) // the scheduler retries; the pod must stay where it is
	if cur, err := c.cs.CoreV1().Pods(taintNS).Get(ctx, p.Name, metav1.GetOptions{}); err != nil || cur.Spec.NodeName != "" || cur.Status.Phase != corev1.PodPending {
		t.Fatalf("before the driver: pod on %q in phase %v (%v), want Pending and unscheduled", cur.Spec.NodeName, cur.Status.Phase, err)
	}

	// The driver, with only --startup-taint's API access plus the base's.
	drvB, err = c.newDriver(b, driverName, drvA.bin, filepath.Join(b.dir, "driver"), "driver-t",
		"--startup-taint="+startupKey, "--kubeconfig="+kc)
	if err != nil {
		t.Fatal(err)
	}
	registered := time.Now()
	if err := drvB.start(ctx); err != nil {
		t.Fatal(err)
	}
	err = waitFor(ctx, 60*time.Second, 100*time.Millisecond, "the driver removes the startup taint", func() (bool, error) {
		return !hasTaint(t, c, b.name), nil
	})
	if err != nil {
		t.Fatalf("%v\ndriver log:\n%s", err, tail(drvB.log(), 20))
	}
	t.Logf("taint removed %v after the driver started", time.Since(registered).Round(time.Millisecond))
	if !strings.Contains(drvB.log(), "Removed the startup taint") {
		t.Errorf("the driver's log does not say it removed the taint")
	}
	p = c.waitPod(t, p, 60*time.Second, 200*time.Millisecond, "the pod runs on the node", func(cur *corev1.Pod) (bool, error) {
		return cur.Spec.NodeName == b.name && cur.Status.Phase == corev1.PodRunning, nil
	})
	if evs := c.eventsWithReason(ctx, p, "FailedMount"); len(evs) > 0 {
		t.Errorf("FailedMount events: %q, want none (the pod starts on its first mount)", evs)
	}
	metrics, err := drvB.scrapeMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, all := metrics.sum("ephemera_rpc_duration_seconds_count", map[string]string{"method": "NodePublishVolume", "code": "OK"}),
		metrics.sum("ephemera_rpc_duration_seconds_count", map[string]string{"method": "NodePublishVolume"}); ok != 1 || all != 1 {
		t.Errorf("NodePublishVolume calls: %v OK of %v, want exactly one, which succeeded", ok, all)
	}

	// The policy: the driver's token changes nothing else.
	for what, patch := range map[string]struct {
		node, body string
	}{
		"another node's taints": {nodeName, `{"spec":{"taints":[{"key":"` + startupKey + `","effect":"NoSchedule"}]}}`},
		"a label":               {b.name, `{"metadata":{"labels":{"example.com/evil":"true"}}}`},
		"another taint":         {b.name, `{"spec":{"taints":[{"key":"example.com/other","effect":"NoSchedule"}]}}`},
		"unschedulable":         {b.name, `{"spec":{"unschedulable":true}}`},
		// Settable once while empty (the API server's own validation lets
		// them through): issue 44, finding 4.
		"spec.podCIDR":    {b.name, `{"spec":{"podCIDR":"10.250.0.0/24"}}`},
		"spec.podCIDRs":   {b.name, `{"spec":{"podCIDRs":["10.250.1.0/24"]}}`},
		"spec.providerID": {b.name, `{"spec":{"providerID":"evil://node"}}`},
	} {
		_, err := sa.CoreV1().Nodes().Patch(ctx, patch.node, types.MergePatchType, []byte(patch.body), metav1.PatchOptions{})
		if err == nil || !(apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) || !strings.Contains(err.Error(), "ephemera-scratch-startup-taint") {
			t.Errorf("%s with the driver's token: %v, want refused by ValidatingAdmissionPolicy ephemera-scratch-startup-taint", what, err)
		}
	}
	if hasTaint(t, c, nodeName) {
		t.Errorf("node %s got the taint from a refused patch", nodeName)
	}
	if n := mustNode(t, c, b.name); n.Labels["example.com/evil"] != "" || n.Spec.Unschedulable || len(n.Spec.Taints) > 1 ||
		n.Spec.PodCIDR != "" || len(n.Spec.PodCIDRs) != 0 || n.Spec.ProviderID != "" {
		t.Errorf("node %s changed by a refused patch: %+v", b.name, n.Spec)
	}
	t.Logf("scenario in %v", time.Since(start).Round(time.Millisecond))
}

func saClient(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func mustNode(t *testing.T, c *cluster, name string) *corev1.Node {
	t.Helper()
	n, err := c.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func hasTaint(t *testing.T, c *cluster, node string) bool {
	t.Helper()
	return slices.ContainsFunc(mustNode(t, c, node).Spec.Taints, func(x corev1.Taint) bool { return x.Key == startupKey })
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
