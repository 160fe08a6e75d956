// Package kube connects an Ephemera driver to the Kubernetes API server. It is
// optional: the framework core needs no API access.
package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

const uidIndex = "uid"

// Pods answers framework.PodChecker from a pod informer restricted to one node
// (field selector spec.nodeName), indexed by UID: the orphan GC asks it whether
// the pod of a volume whose directory is gone still exists before removing the
// volume. Needs RBAC get/list/watch on pods.
type Pods struct {
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
}

// NewPods builds the informer; Start runs it.
func NewPods(client kubernetes.Interface, nodeName string, resync time.Duration) (*Pods, error) {
	if nodeName == "" {
		return nil, errors.New("kube: node name is required")
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	inf := f.Core().V1().Pods().Informer()
	if err := inf.AddIndexers(cache.Indexers{uidIndex: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return []string{string(p.UID)}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	return &Pods{factory: f, informer: inf}, nil
}

// Start runs the informer until ctx ends and waits up to timeout for its first
// sync; PodExists fails until then.
func (p *Pods) Start(ctx context.Context, timeout time.Duration) error {
	p.factory.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), p.informer.HasSynced) {
		return fmt.Errorf("kube: pod informer not synced within %s", timeout)
	}
	return nil
}

// PodExists implements framework.PodChecker.
func (p *Pods) PodExists(_ context.Context, uid string) (bool, error) {
	if !p.informer.HasSynced() {
		return false, errors.New("kube: pod informer has not synced yet")
	}
	objs, err := p.informer.GetIndexer().ByIndex(uidIndex, uid)
	if err != nil {
		return false, err
	}
	return len(objs) > 0, nil
}
