package framework

import (
	"flag"
	"testing"
	"time"
)

func TestBindFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "node-7")
	o := Options{StateDir: "/var/lib/x"}
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	BindFlags(fs, &o)
	if o.NodeID != "node-7" || o.KubeletRootDir != defaultKubeletRoot || o.GCInterval != time.Minute || o.VolumesEndpoint == nil || !*o.VolumesEndpoint {
		t.Fatalf("defaults: %+v", o)
	}
	if err := fs.Parse([]string{"--endpoint=unix:///run/x.sock", "--register", "--gc-interval=-1s", "--metrics-address=:9809", "--volumes-endpoint=false"}); err != nil {
		t.Fatal(err)
	}
	if o.Endpoint != "unix:///run/x.sock" || !o.RegisterWithKubelet || o.GCInterval != -time.Second || o.MetricsAddress != ":9809" || o.StateDir != "/var/lib/x" || *o.VolumesEndpoint {
		t.Fatalf("parsed: %+v", o)
	}
}
