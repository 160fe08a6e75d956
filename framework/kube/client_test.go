package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

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

// fakeAPIServer serves handle behind a Client made from cfg (Host set to the
// server's address): every response is JSON, every request is recorded (its
// body still readable by handle). seen returns what was recorded so far.
func fakeAPIServer(t *testing.T, cfg rest.Config, handle http.HandlerFunc) (c *Client, seen func() []request) {
	t.Helper()
	var mu sync.Mutex
	var reqs []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		mu.Lock()
		reqs = append(reqs, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("Accept"), r.Header.Get("User-Agent"), string(b)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		handle(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg.Host = srv.URL
	c, err := NewClient(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, func() []request {
		mu.Lock()
		defer mu.Unlock()
		return append([]request(nil), reqs...)
	}
}

// apiServer answers every request with the JSON of reply(r) and records it.
func apiServer(t *testing.T, reply func(r *http.Request) any) (*Client, func() []request) {
	t.Helper()
	return fakeAPIServer(t, rest.Config{UserAgent: "test-driver/v1"}, func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewEncoder(w).Encode(reply(r)); err != nil {
			t.Errorf("encoding the reply: %v", err)
		}
	})
}

// uri is the request's method and URI ("GET /api/v1/pods?watch=true").
func (r request) uri() string {
	if r.query == "" {
		return r.method + " " + r.path
	}
	return r.method + " " + r.path + "?" + r.query
}

func TestClientPods(t *testing.T) {
	// A server that ignores the metadata-only Accept sends whole pods; only
	// their identity may reach the informer.
	pod := corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "uid-1", ResourceVersion: "7",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{NodeName: "node-1"}}
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
	want := metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "uid-1", ResourceVersion: "7"}
	if len(l.Items) != 1 || !reflect.DeepEqual(l.Items[0], corev1.Pod{ObjectMeta: want}) || l.ResourceVersion != "7" {
		t.Errorf("List: %+v, want one pod with its identity only", l)
	}
	w, err := c.Pods().Watch(t.Context(), metav1.ListOptions{FieldSelector: selector, ResourceVersion: "7"})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-w.ResultChan()
	w.Stop()
	if p, ok := ev.Object.(*corev1.Pod); ev.Type != watch.Added || !ok || !reflect.DeepEqual(*p, corev1.Pod{ObjectMeta: want}) {
		t.Errorf("watch event %s %T %+v, want ADDED with the pod's identity only", ev.Type, ev.Object, ev.Object)
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
		// Metadata only, in JSON (not protobuf, unlike client-go's typed client).
		wantAccept := []string{acceptMetadataList, acceptMetadata}[i]
		if r.accept != wantAccept || r.userAgent != "test-driver/v1" {
			t.Errorf("request %d: Accept %q, User-Agent %q; want Accept %q", i, r.accept, r.userAgent, wantAccept)
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

// The watch of a metadata-only watch list: a bookmark keeps its annotations
// (the end of the initial events is one), an ERROR event is a Status, other
// events are pods with their identity only.
func TestMetadataDecoder(t *testing.T) {
	stream := `{"type":"ADDED","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"5","annotations":{"x":"y"}}}}
{"type":"BOOKMARK","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"6","annotations":{"k8s.io/initial-events-end":"true"}}}}
{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old resource version"}}
{"type":"SURPRISE","object":{}}
`
	d := &metadataDecoder{body: io.NopCloser(strings.NewReader(stream)), dec: json.NewDecoder(strings.NewReader(stream))}
	typ, obj, err := d.Decode()
	if p, ok := obj.(*corev1.Pod); err != nil || typ != watch.Added || !ok || p.UID != "u1" || p.Annotations != nil {
		t.Errorf("ADDED: %s %+v %v", typ, obj, err)
	}
	typ, obj, err = d.Decode()
	if p, ok := obj.(*corev1.Pod); err != nil || typ != watch.Bookmark || !ok || p.ResourceVersion != "6" || p.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("BOOKMARK: %s %+v %v", typ, obj, err)
	}
	typ, obj, err = d.Decode()
	if st, ok := obj.(*metav1.Status); err != nil || typ != watch.Error || !ok || st.Code != 410 {
		t.Errorf("ERROR: %s %+v %v", typ, obj, err)
	}
	if _, _, err := d.Decode(); err == nil || !strings.Contains(err.Error(), "SURPRISE") {
		t.Errorf("unknown type: %v", err)
	}
	if _, _, err := d.Decode(); err != io.EOF {
		t.Errorf("end of stream: %v, want io.EOF", err)
	}
}

// Events have a rate limiter of their own: with the pods' budget spent (a
// relist), an event is written at once, and the other way round.
func TestClientEventsOwnRateLimiter(t *testing.T) {
	// One request, then one per 1,000 s.
	c, _ := fakeAPIServer(t, rest.Config{QPS: 0.001, Burst: 1}, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			fmt.Fprint(w, `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}`)
			return
		}
		fmt.Fprint(w, `{"kind":"Event","apiVersion":"v1","metadata":{"name":"e","namespace":"ns"}}`)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := c.Pods().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Events().Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns"}}); err != nil {
		t.Fatalf("event after the pods' budget was spent: %v, want it written at once", err)
	}
	if _, err := c.Events().Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns"}}); err == nil {
		t.Fatal("second event within the events' budget of one: written, want the limiter to hold it past the deadline")
	}
}
