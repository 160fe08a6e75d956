package events

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ephemera-csi/ephemera/api"
)

// waitFor lists the events in ns until one has reason, and returns them all.
// The broadcaster writes in order, so everything sent before is handled.
func waitFor(t *testing.T, client *fake.Clientset, ns, reason string) []corev1.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Items {
			if e.Reason == reason {
				return l.Items
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event in %s", reason, ns)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestEventReferencesPod(t *testing.T) {
	client := fake.NewClientset()
	r := NewRecorder(client, "scratch.csi.ephemera.dev", "node-a")
	t.Cleanup(r.Shutdown)
	pod := api.Pod{Namespace: "team", Name: "web-0", UID: "5d6c0b3e-uid"}
	r.Event(pod, corev1.EventTypeWarning, "ProvisioningFailed", `volume "scratch": size 8Gi exceeds the maximum 4Gi`)

	evs := waitFor(t, client, "team", "ProvisioningFailed")
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	e := evs[0]
	want := corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "team", Name: "web-0", UID: "5d6c0b3e-uid"}
	if e.InvolvedObject != want {
		t.Errorf("involvedObject %+v, want %+v", e.InvolvedObject, want)
	}
	if e.Type != corev1.EventTypeWarning || e.Message != `volume "scratch": size 8Gi exceeds the maximum 4Gi` || e.Count != 1 {
		t.Errorf("event %s %q count %d", e.Type, e.Message, e.Count)
	}
	if e.Source.Component != "scratch.csi.ephemera.dev" || e.Source.Host != "node-a" || e.ReportingController != "scratch.csi.ephemera.dev" {
		t.Errorf("source %+v, reportingController %q", e.Source, e.ReportingController)
	}
}

// Events about one pod are limited per minute whatever their reason or type;
// other pods have their own budget; the budget refills with time.
func TestRateLimitPerPod(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(time.Now())
	r := NewRecorder(client, "d", "n", WithRateLimit(3), withClock(clk))
	t.Cleanup(r.Shutdown)
	noisy := api.Pod{Namespace: "ns", Name: "noisy", UID: "u1"}
	quiet := api.Pod{Namespace: "ns", Name: "quiet", UID: "u2"}
	for i := range 50 {
		reason := "ProvisioningFailed"
		if i%2 == 1 {
			reason = "RefreshFailed"
		}
		r.Event(noisy, corev1.EventTypeWarning, reason, fmt.Sprintf("attempt %d failed", i))
	}
	r.Event(quiet, corev1.EventTypeNormal, "OrphanRemoved", "removed")
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel1", "")

	waitFor(t, client, "ns", "Sentinel1")
	if got := writes(client, "noisy"); got != 3 {
		t.Errorf("noisy pod: %d event writes for 50 events, want the burst of 3", got)
	}
	if got := writes(client, "quiet"); got != 1 {
		t.Errorf("quiet pod: %d event writes, want 1 (own budget)", got)
	}

	// A minute later the noisy pod has a budget of 3 again.
	clk.Step(time.Minute)
	for i := range 10 {
		r.Event(noisy, corev1.EventTypeWarning, "ProvisioningFailed", fmt.Sprintf("later attempt %d", i))
	}
	r.Event(api.Pod{Namespace: "ns", Name: "s", UID: "s"}, corev1.EventTypeNormal, "Sentinel2", "")
	waitFor(t, client, "ns", "Sentinel2")
	if got := writes(client, "noisy"); got != 6 {
		t.Errorf("noisy pod after a minute: %d event writes in all, want 6", got)
	}
}

// writes counts the events about pod that the recorder sent: creates, and
// patches (count and message) of events it created. A patch of an event that
// was never created (its first occurrence was rate limited) fails and is
// followed by a create of the same event; that pair is one event.
func writes(client *fake.Clientset, pod string) int {
	n := 0
	created := map[string]bool{}
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "events" {
			continue
		}
		switch a := a.(type) {
		case k8stesting.CreateAction:
			e := a.GetObject().(*corev1.Event)
			created[e.Name] = true
			if e.InvolvedObject.Name == pod {
				n++
			}
		case k8stesting.PatchAction:
			if name, _, _ := strings.Cut(a.GetName(), "."); name == pod && created[a.GetName()] {
				n++
			}
		}
	}
	return n
}

func TestTruncate(t *testing.T) {
	long := strings.Repeat("é", 600) // 1200 bytes
	got := truncate(long, maxMessage)
	if len(got) > maxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Errorf("truncate: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if truncate("short", maxMessage) != "short" {
		t.Error("short message changed")
	}
}
