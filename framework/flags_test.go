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
	if want := (StatsWalkLimits{MaxEntries: 1_000_000, MaxDepth: 128, Timeout: 5 * time.Second, CacheTTL: time.Minute}); o.StatsWalk != want {
		t.Fatalf("stats walk defaults: %+v, want %+v", o.StatsWalk, want)
	}
	if err := fs.Parse([]string{"--endpoint=unix:///run/x.sock", "--register", "--gc-interval=-1s", "--metrics-address=:9809", "--volumes-endpoint=false",
		"--stats-max-entries=5000", "--stats-max-depth=16", "--stats-timeout=2s", "--stats-cache-ttl=-1s"}); err != nil {
		t.Fatal(err)
	}
	if want := (StatsWalkLimits{MaxEntries: 5000, MaxDepth: 16, Timeout: 2 * time.Second, CacheTTL: -time.Second}); o.StatsWalk != want {
		t.Fatalf("stats walk parsed: %+v, want %+v", o.StatsWalk, want)
	}
	if o.Endpoint != "unix:///run/x.sock" || !o.RegisterWithKubelet || o.GCInterval != -time.Second || o.MetricsAddress != ":9809" || o.StateDir != "/var/lib/x" || *o.VolumesEndpoint {
		t.Fatalf("parsed: %+v", o)
	}
}
