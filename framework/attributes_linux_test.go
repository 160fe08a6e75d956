package framework_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// A content-only driver as an author writes it: tmpfs plus a content hook
// that reads the driver's own declared attributes, parsed once by the
// framework. The backend never sees the driver's keys; a refusal of an
// unknown key lists every key a pod may set.
func TestDriverDeclaredAttributes(t *testing.T) {
	var seenByContent []api.Volume
	h := realHarness(t, func(o *framework.Options) {
		o.Volumes.AcceptedAttributes = api.Attributes{
			api.DNSLabelAttr("app").Required(),
			api.EnumAttr("format", "json", "yaml").Default("json"),
		}
		o.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			seenByContent = append(seenByContent, *v)
			return map[string]api.File{"config." + v.Attributes.String("format"): {Data: []byte("app=" + v.Attributes.String("app"))}}, nil
		})
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "web")
	vol := drivertest.InlineVolume{Name: "cfg", Attributes: map[string]string{"app": "web", "size": "1Mi", "mode": "0750"}}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "cfg")
	if b, err := os.ReadFile(filepath.Join(target, "config.json")); err != nil || string(b) != "app=web" {
		t.Errorf("config.json = %q, %v; want the parsed attribute with the default format", b, err)
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("target mode %v, %v: the backend's own attribute (mode) did not reach tmpfs", fi.Mode(), err)
	}
	if len(seenByContent) != 1 || seenByContent[0].Params.Has("app") || !seenByContent[0].Params.Has("mode") {
		t.Errorf("content saw Params %v; want the backend's attributes without the driver's", seenByContent[0].Params)
	}

	for _, tc := range []struct {
		attrs map[string]string
		want  string
	}{
		{map[string]string{"app": "web", "colour": "blue"},
			`invalid volume attributes: unknown attribute(s) "colour"; this driver accepts "app", "backend", "format", "gid", "mode", "nr_inodes", "size", "uid"`},
		{map[string]string{"format": "xml", "size": "1Mi"},
			`invalid volume attributes: attribute "app" is required; attribute "format": "xml" is not one of "json", "yaml"`},
	} {
		p := k.NewPod("ns", "bad")
		err := k.Publish(ctx, p, drivertest.InlineVolume{Name: "cfg", Attributes: tc.attrs})
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tc.want {
			t.Errorf("publish with %v: %v\nwant InvalidArgument %q", tc.attrs, err, tc.want)
		}
		if _, err := os.Stat(k.TargetPath(p, "cfg")); err == nil {
			t.Errorf("a refused publish left its target behind")
		}
	}
	if n := len(records(t, h)); n != 1 {
		t.Errorf("%d records, want the one published volume", n)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}
