package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/ephemera-csi/ephemera/api"
)

// PodsClient lists and watches pods: what Pods needs of the API server.
// Client.Pods is one; so is client-go's typed client, clientset.CoreV1().Pods("").
//
// Pods's informer lists, then watches: it never asks for the initial list as
// a stream of watch events (client-go's WatchListClient), whose cost on the
// API server grows with the cluster's pods rather than the node's (see
// NewPods). A client needs no IsWatchListSemanticsUnSupported method for
// that, client-go's fake clientset included.
type PodsClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Client talks to the resources a driver's optional components use: pods,
// which Pods lists and watches, events, which package events writes, and the
// node, its CSINode and the CSIDriver object (StartupTaint, the startup check
// of the CSIDriver object). It is a REST client whose scheme knows core/v1
// only; the storage.k8s.io objects are read as the JSON they are. client-go's
// typed core/v1 client imports client-go's kubernetes/scheme, which registers
// every API group of Kubernetes: it makes a driver binary much larger, the
// clientset more (docs/operations.md, "Binary size", has the numbers).
//
// A driver that has a clientset anyway may use it instead:
// clientset.CoreV1().Pods("") is a PodsClient, and
// eventstest.Client{C: clientset} an events.Client.
type Client struct {
	rest rest.Interface
	// events writes events through its own rate limiter (cfg's QPS and
	// Burst, a bucket of its own): a burst of events never delays the pod
	// informer's relist, nor the informer an event.
	events rest.Interface
}

// coreCodecs encode and decode the core/v1 types (with the meta/v1 list and
// watch types they need) and nothing else. Built by the first NewClient, not
// at start: a driver without API access does not pay for it.
var coreCodecs = sync.OnceValue(func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err) // only on a duplicate registration, which a new scheme cannot have
	}
	return serializer.NewCodecFactory(s)
})

// NewClient returns a Client of the API server cfg points to (a kubeconfig's,
// clientcmd.BuildConfigFromFlags, or the pod's service account,
// rest.InClusterConfig). It makes no API call. cfg's rate limits apply (by
// default 5 requests per second, bursts of 10), as with client-go's clients,
// twice: once to the pods and the CSIDriver read, once to the events, which
// have a limiter of their own (unless cfg.RateLimiter is set: then it is
// shared).
func NewClient(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = coreCodecs().WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	// RESTClientFor builds a token bucket from QPS and Burst for each client
	// when cfg has no RateLimiter.
	ec, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	return &Client{rest: rc, events: ec}, nil
}

// Pods returns the client of the pods of all namespaces, for
// PodsOptions.Client. It asks for JSON.
func (c *Client) Pods() PodsClient { return podsClient{c.rest} }

// Events returns the client of events, each written in its own namespace, for
// events.Options.Client.
// They go through a rate limiter of their own, not the pods'.
func (c *Client) Events() *EventsClient { return &EventsClient{c.events} }

// podsClient lists and watches pods' metadata only: the API server sends each
// pod as a meta.k8s.io/v1 PartialObjectMetadata (as client-go's metadata
// informers ask), in JSON, and the client hands the informer a Pod holding
// just its identity. A node's pods are then never decoded in full: their
// specs and statuses are most of their bytes, and decoding them kept more
// memory resident (docs/operations.md, "Memory and CPU of the driver").
// A server that ignores the request sends whole pods, of which the same
// metadata is read.
type podsClient struct{ rest rest.Interface }

const (
	acceptMetadataList = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	acceptMetadata     = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

func (p podsClient) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	raw, err := p.rest.Get().Resource("pods").SetHeader("Accept", acceptMetadataList).
		VersionedParams(&opts, metav1.ParameterCodec).Timeout(timeout(opts)).
		DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var ml metav1.PartialObjectMetadataList
	if err := json.Unmarshal(raw, &ml); err != nil {
		return nil, fmt.Errorf("kube: decoding the list of pods: %w", err)
	}
	l := &corev1.PodList{ListMeta: ml.ListMeta, Items: make([]corev1.Pod, len(ml.Items))}
	for i := range ml.Items {
		l.Items[i] = corev1.Pod{ObjectMeta: identity(&ml.Items[i].ObjectMeta, false)}
	}
	return l, nil
}

func (p podsClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	body, err := p.rest.Get().Resource("pods").SetHeader("Accept", acceptMetadata).
		VersionedParams(&opts, metav1.ParameterCodec).
		Stream(ctx)
	if err != nil {
		return nil, err
	}
	return watch.NewStreamWatcher(&metadataDecoder{body: body, dec: json.NewDecoder(body)},
		apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, "ClientWatchDecoding")), nil
}

// identity is the part of a pod's metadata the informer keeps. Annotations
// only for a bookmark: the end of a watch-list's initial events is one.
func identity(m *metav1.ObjectMeta, annotations bool) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
	if annotations {
		out.Annotations = m.Annotations
	}
	return out
}

// metadataDecoder reads the watch events of a metadata-only watch of pods.
type metadataDecoder struct {
	body io.ReadCloser
	dec  *json.Decoder
}

func (d *metadataDecoder) Decode() (watch.EventType, runtime.Object, error) {
	var ev struct {
		Type   watch.EventType `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if err := d.dec.Decode(&ev); err != nil {
		return "", nil, err
	}
	switch ev.Type {
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		var m metav1.PartialObjectMetadata
		if err := json.Unmarshal(ev.Object, &m); err != nil {
			return "", nil, fmt.Errorf("kube: decoding a %s event of a pod: %w", ev.Type, err)
		}
		return ev.Type, &corev1.Pod{ObjectMeta: identity(&m.ObjectMeta, ev.Type == watch.Bookmark)}, nil
	case watch.Error:
		var st metav1.Status
		if err := json.Unmarshal(ev.Object, &st); err != nil {
			return "", nil, fmt.Errorf("kube: decoding an error event: %w", err)
		}
		return ev.Type, &st, nil
	default:
		return "", nil, fmt.Errorf("kube: watch event of unknown type %q", ev.Type)
	}
}

func (d *metadataDecoder) Close() { _ = d.body.Close() }

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// EventsClient writes core/v1 events in the namespace of each, in JSON. It is
// the events.Client of events.Options.
type EventsClient struct{ rest rest.Interface }

// Create creates e.
func (c *EventsClient) Create(ctx context.Context, e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := c.rest.Post().NamespaceIfScoped(e.Namespace, e.Namespace != "").Resource("events").
		Body(e).Do(ctx).Into(out)
	return out, err
}

// Patch applies the JSON merge patch data to the event namespace/name.
func (c *EventsClient) Patch(ctx context.Context, namespace, name string, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := c.rest.Patch(types.MergePatchType).NamespaceIfScoped(namespace, namespace != "").Resource("events").Name(name).
		Body(data).Do(ctx).Into(out)
	return out, err
}

// csiDriverPath is where the API server serves CSIDriver objects.
const csiDriverPath = "/apis/storage.k8s.io/v1/csidrivers"

// csiDriverJSON is the part of a storage.k8s.io/v1 CSIDriver that
// GetCSIDriver reads. Decoding it with encoding/json instead of
// k8s.io/api/storage/v1's types keeps that package (and its generated
// protobuf and deep-copy code) out of the driver binary.
type csiDriverJSON struct {
	Metadata struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		AttachRequired       *bool    `json:"attachRequired"`
		PodInfoOnMount       *bool    `json:"podInfoOnMount"`
		VolumeLifecycleModes []string `json:"volumeLifecycleModes"`
		FSGroupPolicy        *string  `json:"fsGroupPolicy"`
		RequiresRepublish    *bool    `json:"requiresRepublish"`
	} `json:"spec"`
}

// GetCSIDriver reads the CSIDriver object called name (storage.k8s.io/v1) in
// JSON: a framework.CSIDriverGetter (Options.Observability.CSIDrivers). A missing object is
// an error wrapping api.ErrNotFound. The service account needs get on
// csidrivers.storage.k8s.io.
//
// It reads with resourceVersion "0": the API server answers from its watch
// cache, not from etcd (a startup check of 5,000 restarting drivers is 5,000
// reads; the object changes rarely, and a stale answer is corrected by the
// next start).
func (c *Client) GetCSIDriver(ctx context.Context, name string) (*api.CSIDriver, error) {
	body, err := c.rest.Get().AbsPath(csiDriverPath, name).Param("resourceVersion", "0").DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: CSIDriver %q", api.ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading CSIDriver %q: %w", name, err)
	}
	var o csiDriverJSON
	if err := json.Unmarshal(body, &o); err != nil {
		return nil, fmt.Errorf("decoding CSIDriver %q: %w", name, err)
	}
	return &api.CSIDriver{
		Name:                 o.Metadata.Name,
		UID:                  o.Metadata.UID,
		AttachRequired:       o.Spec.AttachRequired,
		PodInfoOnMount:       o.Spec.PodInfoOnMount,
		VolumeLifecycleModes: o.Spec.VolumeLifecycleModes,
		FSGroupPolicy:        o.Spec.FSGroupPolicy,
		RequiresRepublish:    o.Spec.RequiresRepublish,
	}, nil
}

// GetNode reads the node called name (core/v1), from the API server's watch
// cache when cached (resourceVersion=0): a NodesClient. The service account
// needs get on nodes.
func (c *Client) GetNode(ctx context.Context, name string, cached bool) (*corev1.Node, error) {
	req := c.rest.Get().Resource("nodes").Name(name)
	if cached {
		req = req.Param("resourceVersion", "0")
	}
	out := &corev1.Node{}
	if err := req.Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// PatchNode applies the JSON merge patch data to the node called name. The
// service account needs patch on nodes.
func (c *Client) PatchNode(ctx context.Context, name string, data []byte) error {
	return c.rest.Patch(types.MergePatchType).Resource("nodes").Name(name).Body(data).Do(ctx).Error()
}

// csiNodePath is where the API server serves CSINode objects.
const csiNodePath = "/apis/storage.k8s.io/v1/csinodes"

// CSINodeDrivers returns the names of the drivers the CSINode object called
// name lists (none when there is no CSINode yet), read from the API server's
// watch cache and decoded with encoding/json, as GetCSIDriver does. The
// service account needs get on csinodes.storage.k8s.io.
func (c *Client) CSINodeDrivers(ctx context.Context, name string) ([]string, error) {
	body, err := c.rest.Get().AbsPath(csiNodePath, name).Param("resourceVersion", "0").DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var o struct {
		Spec struct {
			Drivers []struct {
				Name string `json:"name"`
			} `json:"drivers"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(body, &o); err != nil {
		return nil, fmt.Errorf("decoding CSINode %q: %w", name, err)
	}
	names := make([]string, 0, len(o.Spec.Drivers))
	for _, d := range o.Spec.Drivers {
		names = append(names, d.Name)
	}
	return names, nil
}

// DaemonSetSize returns how many nodes should run the DaemonSet called name
// in namespace (its status.desiredNumberScheduled): the drivers that may all
// start at once with this one, for PodsOptions.FleetSize and the framework's
// ObservabilityOptions.FleetSize. One GET, answered from the API server's
// watch cache (resourceVersion "0"), decoded with encoding/json as
// GetCSIDriver does; the service account needs get on daemonsets.apps
// (deploy/base's ClusterRole names the driver's DaemonSets).
func (c *Client) DaemonSetSize(ctx context.Context, namespace, name string) (int, error) {
	if namespace == "" || name == "" {
		return 0, fmt.Errorf("reading DaemonSet %q in namespace %q: both are required", name, namespace)
	}
	body, err := c.rest.Get().AbsPath("/apis/apps/v1/namespaces", namespace, "daemonsets", name).Param("resourceVersion", "0").DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("%w: DaemonSet %s/%s", api.ErrNotFound, namespace, name)
	}
	if err != nil {
		return 0, fmt.Errorf("reading DaemonSet %s/%s: %w", namespace, name, err)
	}
	var o struct {
		Status struct {
			DesiredNumberScheduled int `json:"desiredNumberScheduled"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &o); err != nil {
		return 0, fmt.Errorf("decoding DaemonSet %s/%s: %w", namespace, name, err)
	}
	return o.Status.DesiredNumberScheduled, nil
}
