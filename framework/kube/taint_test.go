package kube

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/framework"
)

var (
	_ framework.Runnable = (*StartupTaint)(nil)
	_ NodesClient        = (*Client)(nil)
)

const (
	taintKey   = "ephemera.dev/scratch-not-ready"
	taintNode  = "node-1"
	taintDrv   = "scratch.csi.ephemera.dev"
	otherTaint = "example.com/dedicated"
)

// fakeNodes is NodesClient over a fake clientset; it records the cached
// argument of each GetNode.
type fakeNodes struct {
	cs    *fake.Clientset
	mu    *sync.Mutex
	reads *[]bool
}

func newFakeNodes(cs *fake.Clientset) fakeNodes {
	return fakeNodes{cs, new(sync.Mutex), new([]bool)}
}

func (f fakeNodes) nodeReads() []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(*f.reads)
}

func (f fakeNodes) GetNode(ctx context.Context, name string, cached bool) (*corev1.Node, error) {
	f.mu.Lock()
	*f.reads = append(*f.reads, cached)
	f.mu.Unlock()
	o := metav1.GetOptions{}
	if cached {
		o.ResourceVersion = "0"
	}
	return f.cs.CoreV1().Nodes().Get(ctx, name, o)
}

func (f fakeNodes) PatchNode(ctx context.Context, name string, data []byte) error {
	_, err := f.cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{})
	return err
}

func (f fakeNodes) CSINodeDrivers(ctx context.Context, name string) ([]string, error) {
	c, err := f.cs.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, d := range c.Spec.Drivers {
		names = append(names, d.Name)
	}
	return names, nil
}

func taintedNode(taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: taintNode, ResourceVersion: "7", Labels: map[string]string{"a": "b"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.0.0.0/24", Taints: taints},
	}
}

func csiNode(drivers ...string) *storagev1.CSINode {
	c := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: taintNode}}
	for _, d := range drivers {
		c.Spec.Drivers = append(c.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: taintNode})
	}
	return c
}

var (
	startup = corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule}
	other   = corev1.Taint{Key: otherTaint, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
)

// taintRun runs a StartupTaint over cs whose waits are recorded and return at
// once; onWait runs at each wait (n: how many so far) and may change cs. It
// returns when the taint is handled (Run blocks on ctx then), or after
// maxWaits waits; waits are the requested durations.
type taintRun struct {
	st    *StartupTaint
	nodes fakeNodes
	mu    sync.Mutex
	waits []time.Duration
}

func newTaintRun(t *testing.T, cs *fake.Clientset, maxWaits int, onWait func(n int)) (*taintRun, context.CancelFunc, chan error) {
	t.Helper()
	nodes := newFakeNodes(cs)
	st, err := NewStartupTaint(StartupTaintOptions{Client: nodes, NodeName: taintNode, DriverName: taintDrv, Key: taintKey, Logger: textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(io.Discard)))})
	if err != nil {
		t.Fatal(err)
	}
	r := &taintRun{st: st, nodes: nodes}
	ctx, cancel := context.WithCancel(t.Context())
	st.sleep = func(ctx context.Context, d time.Duration) bool {
		r.mu.Lock()
		r.waits = append(r.waits, d)
		n := len(r.waits)
		r.mu.Unlock()
		if n > maxWaits {
			<-ctx.Done()
			return false
		}
		if onWait != nil {
			onWait(n)
		}
		return ctx.Err() == nil
	}
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	t.Cleanup(cancel)
	return r, cancel, done
}

func (r *taintRun) nWaits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waits)
}

// waitPatched waits until the node's taints are want (or fails after 10s).
func waitTaints(t *testing.T, cs *fake.Clientset, want []corev1.Taint) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := cs.CoreV1().Nodes().Get(t.Context(), taintNode, metav1.GetOptions{})
		if err == nil && reflect.DeepEqual(n.Spec.Taints, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node taints %v (err %v), want %v", n.Spec.Taints, err, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func patches(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, string(p.GetPatchType())+" "+string(p.GetPatch()))
		}
	}
	return out
}

func verbs(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
	}
	return out
}

// The taint stays until the CSINode lists the driver, then goes; every other
// taint and field stays; Run keeps running until its context ends.
func TestStartupTaintRemovedOnceRegistered(t *testing.T) {
	cs := fake.NewClientset(taintedNode(other, startup), csiNode("other.csi.example.com"))
	r, cancel, done := newTaintRun(t, cs, 100, func(n int) {
		if n == 3 { // the kubelet registers the driver
			if _, err := cs.StorageV1().CSINodes().Update(context.Background(), csiNode("other.csi.example.com", taintDrv), metav1.UpdateOptions{}); err != nil {
				t.Error(err)
			}
		}
	})
	waitTaints(t, cs, []corev1.Taint{other})
	if n := r.nWaits(); n != 3 {
		t.Errorf("%d waits, want 3 (the taint goes at the first try after the registration)", n)
	}
	ps := patches(cs)
	if len(ps) != 1 || ps[0] != `application/merge-patch+json {"metadata":{"resourceVersion":"7"},"spec":{"taints":[{"key":"example.com/dedicated","value":"gpu","effect":"NoSchedule"}]}}` {
		t.Errorf("patches %q, want one merge patch of the taints, conditional on the resourceVersion", ps)
	}
	n, _ := cs.CoreV1().Nodes().Get(t.Context(), taintNode, metav1.GetOptions{})
	if n.Spec.PodCIDR != "10.0.0.0/24" || n.Labels["a"] != "b" {
		t.Errorf("the patch changed more than the taints: %+v", n)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v before its context ended", err)
	case <-time.After(20 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	// Waits: jittered, doubling from 1s.
	for i, w := range r.waits[:3] {
		step := time.Second << i
		if w < step/2 || w >= step*3/2 {
			t.Errorf("wait %d: %v, want in [%v, %v)", i, w, step/2, step*3/2)
		}
	}
}

// The only startup taint: the list goes (null in the patch).
func TestStartupTaintLastTaint(t *testing.T) {
	cs := fake.NewClientset(taintedNode(startup), csiNode(taintDrv))
	_, _, _ = newTaintRun(t, cs, 100, nil)
	waitTaints(t, cs, nil)
	if ps := patches(cs); len(ps) != 1 || !strings.HasSuffix(ps[0], `"spec":{"taints":null}}`) {
		t.Errorf("patches %q", ps)
	}
}

// A node without the taint (every start after the first): one cached GET of
// the node, nothing else.
func TestStartupTaintAbsent(t *testing.T) {
	cs := fake.NewClientset(taintedNode(other), csiNode(taintDrv))
	r, cancel, done := newTaintRun(t, cs, 100, nil)
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := verbs(cs); !reflect.DeepEqual(got, []string{"get nodes"}) || r.nWaits() != 0 {
		t.Errorf("API calls %q, %d waits: want one get of the node", got, r.nWaits())
	}
	if a := cs.Actions()[0].(k8stesting.GetAction); a.GetName() != taintNode {
		t.Errorf("got %s", a.GetName())
	}
}

// A node that changed between the read and the patch (409): read again, patch
// again; the backoff starts over.
func TestStartupTaintConflict(t *testing.T) {
	cs := fake.NewClientset(taintedNode(startup, other), csiNode(taintDrv))
	conflicts := 1
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, taintNode, errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	r, _, _ := newTaintRun(t, cs, 100, nil)
	waitTaints(t, cs, []corev1.Taint{other})
	if len(patches(cs)) != 2 || r.nWaits() != 1 {
		t.Errorf("%d patches, %d waits: want 2 and 1", len(patches(cs)), r.nWaits())
	}
	// After a failure the node is read with its latest version, not from the cache.
	if got := r.nodes.nodeReads(); !reflect.DeepEqual(got, []bool{true, false, false}) {
		t.Errorf("node reads (cached?) %v, want [true false false]: cached, latest before the patch, latest after the conflict", got)
	}
}

// Refused (RBAC or the admission policy): the taint stays, the driver keeps
// trying with a backoff capped at MaxBackoff, and Run returns when ctx ends.
func TestStartupTaintForbidden(t *testing.T) {
	cs := fake.NewClientset(taintedNode(startup), csiNode(taintDrv))
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, taintNode, errors.New("denied by ValidatingAdmissionPolicy"))
	})
	r, cancel, done := newTaintRun(t, cs, 8, nil)
	for r.nWaits() <= 8 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	waitTaints(t, cs, []corev1.Taint{startup})
	if last := r.waits[7]; last < 15*time.Second || last >= 45*time.Second {
		t.Errorf("8th wait %v: want the 30s cap, jittered", last)
	}
	if n := len(patches(cs)); n != 9 {
		t.Errorf("%d patches, want 9 (one per try)", n)
	}
}

func TestStartupTaintOptions(t *testing.T) {
	ok := StartupTaintOptions{Client: newFakeNodes(fake.NewClientset()), NodeName: taintNode, DriverName: taintDrv, Key: taintKey}
	if _, err := NewStartupTaint(ok); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(o *StartupTaintOptions){
		"no client":        func(o *StartupTaintOptions) { o.Client = nil },
		"no node":          func(o *StartupTaintOptions) { o.NodeName = "" },
		"no driver":        func(o *StartupTaintOptions) { o.DriverName = "" },
		"no key":           func(o *StartupTaintOptions) { o.Key = "" },
		"bad key":          func(o *StartupTaintOptions) { o.Key = "not a key:NoSchedule" },
		"negative backoff": func(o *StartupTaintOptions) { o.InitialBackoff = -time.Second },
	} {
		o := ok
		mod(&o)
		if _, err := NewStartupTaint(o); err == nil || !strings.Contains(err.Error(), "invalid StartupTaintOptions") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Client's NodesClient requests: the cached reads carry resourceVersion=0,
// the patch is a merge patch of the node, a missing CSINode is no driver.
func TestClientNodes(t *testing.T) {
	c, seen := fakeAPIServer(t, rest.Config{}, func(w http.ResponseWriter, r *http.Request) {
		var reply any
		switch r.URL.Path {
		case "/api/v1/nodes/node-1":
			n := taintedNode(startup)
			n.APIVersion, n.Kind = "v1", "Node"
			reply = n
		case "/apis/storage.k8s.io/v1/csinodes/node-1":
			reply = csiNode("a.example.com", taintDrv)
		default:
			w.WriteHeader(http.StatusNotFound)
			reply = metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound}
		}
		_ = json.NewEncoder(w).Encode(reply)
	})
	ctx := t.Context()
	n, err := c.GetNode(ctx, taintNode, true)
	if err != nil || !reflect.DeepEqual(n.Spec.Taints, []corev1.Taint{startup}) || n.ResourceVersion != "7" {
		t.Fatalf("GetNode: %v %+v", err, n)
	}
	if _, err := c.GetNode(ctx, taintNode, false); err != nil {
		t.Fatal(err)
	}
	if err := c.PatchNode(ctx, taintNode, []byte(`{"spec":{"taints":null}}`)); err != nil {
		t.Fatal(err)
	}
	drivers, err := c.CSINodeDrivers(ctx, taintNode)
	if err != nil || !reflect.DeepEqual(drivers, []string{"a.example.com", taintDrv}) {
		t.Errorf("CSINodeDrivers: %v %q", err, drivers)
	}
	if drivers, err := c.CSINodeDrivers(ctx, "node-2"); err != nil || len(drivers) != 0 {
		t.Errorf("CSINodeDrivers of a node without CSINode: %v %q", err, drivers)
	}
	if _, err := c.GetNode(ctx, "node-2", true); !apierrors.IsNotFound(err) {
		t.Errorf("GetNode of a missing node: %v, want NotFound", err)
	}
	want := []string{
		"GET /api/v1/nodes/node-1?resourceVersion=0  ",
		"GET /api/v1/nodes/node-1?  ",
		`PATCH /api/v1/nodes/node-1? application/merge-patch+json {"spec":{"taints":null}}`,
		"GET /apis/storage.k8s.io/v1/csinodes/node-1?resourceVersion=0  ",
		"GET /apis/storage.k8s.io/v1/csinodes/node-2?resourceVersion=0  ",
		"GET /api/v1/nodes/node-2?resourceVersion=0  ",
	}
	var got []string
	for _, r := range seen() {
		got = append(got, r.method+" "+r.path+"?"+r.query+" "+r.contentType+" "+r.body)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
