package kube

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/ephemera-csi/ephemera/framework/events"
)

var (
	_ PodsClient    = podsClient{}
	_ events.Client = (*EventsClient)(nil)
)

// request is what the fake API server saw of one request.
type request struct {
	method, path, query, contentType, accept, userAgent, body string
}

// apiServer answers every request with the JSON of reply(r) and records it.
func apiServer(t *testing.T, reply func(r *http.Request) any) (*Client, func() []request) {
	t.Helper()
	var mu sync.Mutex
	var seen []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("Accept"), r.Header.Get("User-Agent"), string(b)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(reply(r)); err != nil {
			t.Errorf("encoding the reply: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(&rest.Config{Host: srv.URL, UserAgent: "test-driver/v1"})
	if err != nil {
		t.Fatal(err)
	}
	return c, func() []request {
		mu.Lock()
		defer mu.Unlock()
		return append([]request(nil), seen...)
	}
}

func TestClientPods(t *testing.T) {
	pod := corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "uid-1", ResourceVersion: "7"}}
	c, seen := apiServer(t, func(r *http.Request) any {
		if r.URL.Query().Get("watch") == "true" {
			return metav1.WatchEvent{Type: string(watch.Added), Object: runtimeRaw(t, pod)}
		}
		return corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"},
			ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: []corev1.Pod{pod}}
	})
	selector := "spec.nodeName=node-1"
	l, err := c.Pods().List(t.Context(), metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || l.Items[0].UID != "uid-1" || l.ResourceVersion != "7" {
		t.Errorf("List: %+v", l)
	}
	w, err := c.Pods().Watch(t.Context(), metav1.ListOptions{FieldSelector: selector, ResourceVersion: "7"})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-w.ResultChan()
	w.Stop()
	if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Added || !ok || p.UID != "uid-1" {
		t.Errorf("watch event %s %T %+v", ev.Type, ev.Object, ev.Object)
	}

	reqs := seen()
	if len(reqs) != 2 {
		t.Fatalf("requests %+v, want a list and a watch", reqs)
	}
	for i, wantQuery := range []string{"fieldSelector=spec.nodeName%3Dnode-1", "fieldSelector=spec.nodeName%3Dnode-1&resourceVersion=7&watch=true"} {
		r := reqs[i]
		if r.method != http.MethodGet || r.path != "/api/v1/pods" || r.query != wantQuery {
			t.Errorf("request %d: %s %s?%s, want GET /api/v1/pods?%s", i, r.method, r.path, r.query, wantQuery)
		}
		// JSON, not protobuf (unlike client-go's typed client).
		if r.accept != "application/json, */*" || r.userAgent != "test-driver/v1" {
			t.Errorf("request %d: Accept %q, User-Agent %q", i, r.accept, r.userAgent)
		}
	}
}

func TestClientEvents(t *testing.T) {
	c, seen := apiServer(t, func(r *http.Request) any {
		return corev1.Event{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
			ObjectMeta: metav1.ObjectMeta{Name: "web.1", Namespace: "ns", ResourceVersion: "3"}}
	})
	e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "web.1", Namespace: "ns"}, Reason: "ProvisioningFailed", Count: 1}
	s := c.Events()
	if out, err := s.Create(t.Context(), e); err != nil || out.ResourceVersion != "3" {
		t.Fatalf("Create: %+v, %v", out, err)
	}
	if _, err := s.Patch(t.Context(), "ns", "web.1", []byte(`{"count":2}`)); err != nil {
		t.Fatalf("Patch: %v", err)
	}
	want := []struct{ method, path, contentType, body string }{
		{http.MethodPost, "/api/v1/namespaces/ns/events", "application/json", `"reason":"ProvisioningFailed"`},
		{http.MethodPatch, "/api/v1/namespaces/ns/events/web.1", "application/merge-patch+json", `{"count":2}`},
	}
	reqs := seen()
	if len(reqs) != len(want) {
		t.Fatalf("requests %+v, want %d", reqs, len(want))
	}
	for i, w := range want {
		r := reqs[i]
		if r.method != w.method || r.path != w.path || r.contentType != w.contentType || !strings.Contains(r.body, w.body) {
			t.Errorf("request %d: %s %s (%s) %s, want %s %s (%s) with %s", i, r.method, r.path, r.contentType, r.body, w.method, w.path, w.contentType, w.body)
		}
	}
}

// runtimeRaw is obj as the raw JSON of a watch event's object.
func runtimeRaw(t *testing.T, obj any) (raw runtime.RawExtension) {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	raw.Raw = b
	return raw
}
