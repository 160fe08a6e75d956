package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ephemera-csi/ephemera/framework"
)

var _ framework.PodChecker = (*Pods)(nil)

func TestPodsExists(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: types.UID("uid-1")}, Spec: corev1.PodSpec{NodeName: "node-1"}}
	client := fake.NewClientset(pod)
	p, err := NewPods(client, "node-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.PodExists(t.Context(), "uid-1"); err == nil {
		t.Fatal("PodExists answered before the informer synced")
	}
	if err := p.Start(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.PodExists(t.Context(), "uid-1"); err != nil || !ok {
		t.Fatalf("existing pod: %v %v", ok, err)
	}
	if ok, err := p.PodExists(t.Context(), "uid-2"); err != nil || ok {
		t.Fatalf("unknown pod: %v %v", ok, err)
	}
	if err := client.CoreV1().Pods("ns").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, _ := p.PodExists(t.Context(), "uid-1")
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("deleted pod still reported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := NewPods(client, "", 0); err == nil {
		t.Error("empty node name accepted")
	}
}
