package kube

import (
	"context"
	"encoding/json"
	"fmt"
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
// Pods's informer asks for the initial list as a stream of watch events
// (client-go's WatchListClient, on by default) unless the client has a method
// IsWatchListSemanticsUnSupported() bool that returns true, as client-go's fake
// clientset has: wrap the fake's pods client with that method in tests, or the
// informer never syncs.
type PodsClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Client talks to the two core/v1 resources a driver's optional components
// use: pods, which Pods lists and watches, and events, which package events
// writes. It is a REST client whose scheme knows core/v1 only. client-go's
// typed core/v1 client imports client-go's kubernetes/scheme, which registers
// every API group of Kubernetes: it makes a driver binary 15-20 MB larger, the
// clientset more (docs/operations.md, "Binary size").
//
// A driver that has a clientset anyway may use it instead:
// clientset.CoreV1().Pods("") is a PodsClient, and
// eventstest.Client{C: clientset} an events.Client.
type Client struct {
	rest rest.Interface
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
// default 5 requests per second, bursts of 10), as with client-go's clients.
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
	return &Client{rest: rc}, nil
}

// Pods returns the client of the pods of all namespaces, for
// PodsOptions.Client. It asks for JSON.
func (c *Client) Pods() PodsClient { return podsClient{c.rest} }

// Events returns the client of events, each written in its own namespace, for
// events.Options.Client.
func (c *Client) Events() *EventsClient { return &EventsClient{c.rest} }

// podsClient lists and watches pods as client-go's typed client does, but in
// JSON where that client prefers protobuf: decoding a node's pods in
// protobuf runs (and so keeps resident) about 1 MiB more of the binary than
// JSON, which the rest of the client uses anyway, for no gain at a node's
// scale (docs/operations.md, "Memory and CPU of the driver").
type podsClient struct{ rest rest.Interface }

func (p podsClient) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	l := &corev1.PodList{}
	err := p.rest.Get().Resource("pods").
		VersionedParams(&opts, metav1.ParameterCodec).Timeout(timeout(opts)).
		Do(ctx).Into(l)
	return l, err
}

func (p podsClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return p.rest.Get().Resource("pods").
		VersionedParams(&opts, metav1.ParameterCodec).Timeout(timeout(opts)).
		Watch(ctx)
}

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
// JSON: a framework.CSIDriverGetter (Options.CSIDrivers). A missing object is
// an error wrapping api.ErrNotFound. The service account needs get on
// csidrivers.storage.k8s.io.
func (c *Client) GetCSIDriver(ctx context.Context, name string) (*api.CSIDriver, error) {
	body, err := c.rest.Get().AbsPath(csiDriverPath, name).DoRaw(ctx)
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
