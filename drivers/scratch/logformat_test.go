package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
)

// --log-format=json writes one JSON object per line of what klog lets through
// (--v), with values as the text format shows them: never a secret.
func TestJSONLogFormat(t *testing.T) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Set("v", "2"); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := setLogFormat("json", &buf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		klog.ClearLogger()
		_ = fs.Set("v", "0")
	})

	vol := &api.Volume{ID: "csi-1", Backend: "tmpfs", Pod: api.Pod{Namespace: "ns", Name: "web"}, Secrets: api.Secrets{"password": "topsecret"}}
	req := &csi.NodePublishVolumeRequest{VolumeId: "csi-1", Secrets: map[string]string{"password": "topsecret"}}
	klog.InfoS("Serving CSI", "endpoint", "unix:///csi/csi.sock", "volumes", 3, "duration", 1500*time.Millisecond)
	klog.V(2).InfoS("Published", "pod", klog.KRef("ns", "web"), "volume", vol)
	klog.V(3).InfoS("Not logged at --v=2")
	klog.Background().WithValues("driver", "scratch.csi.ephemera.dev").V(1).Info("Request", "request", protosanitizer.StripSecrets(req))
	klog.ErrorS(errors.New("mount: no such device"), "Publish failed", "volume", vol)
	klog.Flush()

	if strings.Contains(buf.String(), "topsecret") {
		t.Errorf("a secret in the log:\n%s", buf.String())
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), buf.String())
	}
	var got []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not JSON: %q: %v", l, err)
		}
		if _, ok := m["time"]; !ok {
			t.Errorf("no time: %q", l)
		}
		got = append(got, m)
	}
	want := []map[string]any{
		{"level": "INFO", "msg": "Serving CSI", "endpoint": "unix:///csi/csi.sock", "volumes": 3.0, "duration": "1.5s", "v": 0.0},
		{"level": "INFO", "msg": "Published", "v": 2.0},
		{"level": "INFO", "msg": "Request", "driver": "scratch.csi.ephemera.dev", "v": 1.0},
		{"level": "ERROR", "msg": "Publish failed", "err": "mount: no such device"},
	}
	for i, w := range want {
		for k, v := range w {
			if got[i][k] != v {
				t.Errorf("line %d: %s = %#v, want %#v (%s)", i, k, got[i][k], v, lines[i])
			}
		}
	}
	if pod, _ := got[1]["pod"].(map[string]any); pod["name"] != "web" || pod["namespace"] != "ns" {
		t.Errorf("pod %v, want klog.KRef's name and namespace", got[1]["pod"])
	}
	if v, _ := got[1]["volume"].(map[string]any); v["id"] != "csi-1" || v["pod"] != "ns/web" || len(v) != 3 {
		t.Errorf("volume %v, want api.Volume's MarshalLog (its identity only)", got[1]["volume"])
	}
	if r, _ := got[2]["request"].(string); !strings.Contains(r, `"volume_id":"csi-1"`) || !strings.Contains(r, "stripped") {
		t.Errorf("request %v, want protosanitizer's string", got[2]["request"])
	}
	if _, ok := got[3]["v"]; ok {
		t.Errorf("an error line has v: %s", lines[3])
	}

	if err := setLogFormat("yaml", &buf); err == nil {
		t.Error("--log-format=yaml accepted")
	}
}
