package framework_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// Content that does not fit its volume fails the publish with
// ResourceExhausted and a message a pod's author can act on: what the content
// takes, the volume's size and the attribute to raise; once, without the
// descriptor paths the driver writes through (/proc/self/fd/N) and without a
// prefix said twice. The volume is rolled back.
func TestContentThatDoesNotFit(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{"big": {Data: bytes.Repeat([]byte{'x'}, 2<<20)}}, nil
		})
	})
	k := h.Kubelet
	pod := k.NewPod("ns", "full")
	err := k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("publish of 2MiB of content into 1Mi: %v, want ResourceExhausted", err)
	}
	msg := status.Convert(err).Message()
	for _, want := range []string{"the content does not fit the volume (1 files, 2097152 bytes of data", `the volume's size is 1Mi: ask for a larger "size"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	for _, bad := range []string{"/proc/self/fd", "..20"} {
		if strings.Contains(msg, bad) {
			t.Errorf("message %q holds %q", msg, bad)
		}
	}
	for _, once := range []string{"writing content", "resource exhausted", "does not fit"} {
		if n := strings.Count(msg, once); n > 1 {
			t.Errorf("message %q says %q %d times", msg, once, n)
		}
	}
	if err := k.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}
