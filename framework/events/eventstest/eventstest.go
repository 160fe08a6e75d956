package eventstest

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Client writes events through the clientset C.
type Client struct{ C kubernetes.Interface }

// Create implements events.Client.
func (c Client) Create(ctx context.Context, e *corev1.Event) (*corev1.Event, error) {
	return c.C.CoreV1().Events(e.Namespace).Create(ctx, e, metav1.CreateOptions{})
}

// Patch implements events.Client with a JSON merge patch.
func (c Client) Patch(ctx context.Context, namespace, name string, data []byte) (*corev1.Event, error) {
	return c.C.CoreV1().Events(namespace).Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{})
}
