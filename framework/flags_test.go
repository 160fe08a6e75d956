package framework

import (
	"flag"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBindFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "node-7")
	o := Options{Node: NodeOptions{StateDir: "/var/lib/x"}}
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	BindFlags(fs, &o)
	if o.Node.ID != "node-7" || o.Node.KubeletRootDir != defaultKubeletRoot || o.GC.Interval != time.Minute || o.Observability.VolumesEndpoint == nil || !*o.Observability.VolumesEndpoint {
		t.Fatalf("defaults: %+v", o)
	}
	if want := (StatsWalkLimits{MaxEntries: 1_000_000, MaxDepth: 128, Timeout: 5 * time.Second, MaxConcurrent: 4, MaxLinkedFiles: 1 << 16, CacheTTL: time.Minute}); o.Limits.StatsWalk != want {
		t.Fatalf("stats walk defaults: %+v, want %+v", o.Limits.StatsWalk, want)
	}
	if err := fs.Parse([]string{"--endpoint=unix:///run/x.sock", "--register", "--gc-interval=-1s", "--metrics-address=:9809", "--volumes-endpoint=false",
		"--stats-max-entries=5000", "--stats-max-depth=16", "--stats-timeout=2s", "--stats-cache-ttl=-1s", "--stats-max-walks=2", "--stats-max-linked-files=1000", "--content-capacity=-1",
		"--memory-limit=268435456", "--keep-binary-pages", "--max-in-flight=16", "--max-in-flight-per-backend=6", "--in-flight-reserved-per-backend=2", "--max-volumes-per-pod=-1", "--operation-timeout=5s", "--content-timeout=2s"}); err != nil {
		t.Fatal(err)
	}
	if want := (StatsWalkLimits{MaxEntries: 5000, MaxDepth: 16, Timeout: 2 * time.Second, MaxConcurrent: 2, MaxLinkedFiles: 1000, CacheTTL: -time.Second}); o.Limits.StatsWalk != want {
		t.Fatalf("stats walk parsed: %+v, want %+v", o.Limits.StatsWalk, want)
	}
	if o.Limits.MaxInFlightPerBackend != 6 || o.Limits.InFlightReservedPerBackend != 2 || o.Limits.MaxVolumesPerPod != NoMaxVolumesPerPod {
		t.Fatalf("lanes parsed: %d, %d, %d", o.Limits.MaxInFlightPerBackend, o.Limits.InFlightReservedPerBackend, o.Limits.MaxVolumesPerPod)
	}
	if o.Limits.MaxInFlight != 16 || o.Limits.OperationTimeout != 5*time.Second || o.Volumes.ContentTimeout != 2*time.Second {
		t.Fatalf("in flight, timeouts parsed: %d, %v, %v", o.Limits.MaxInFlight, o.Limits.OperationTimeout, o.Volumes.ContentTimeout)
	}
	if o.Volumes.ContentCapacity != NoContentCapacity {
		t.Fatalf("--content-capacity=-1 parsed as %d", o.Volumes.ContentCapacity)
	}
	if o.Limits.MemoryLimit != 256<<20 || !o.Limits.KeepBinaryPages {
		t.Fatalf("memory limit, binary pages parsed: %d, %v", o.Limits.MemoryLimit, o.Limits.KeepBinaryPages)
	}
	if o.Node.Endpoint != "unix:///run/x.sock" || !o.Node.RegisterWithKubelet || o.GC.Interval != -time.Second || o.Observability.MetricsAddress != ":9809" || o.Node.StateDir != "/var/lib/x" || *o.Observability.VolumesEndpoint {
		t.Fatalf("parsed: %+v", o)
	}
}

func TestMemoryLimitFlag(t *testing.T) {
	for in, want := range map[string]int64{"256Mi": 256 << 20, "268435456": 256 << 20, "1Gi": 1 << 30, "0": 0} {
		var o Options
		fs := flag.NewFlagSet("driver", flag.ContinueOnError)
		BindFlags(fs, &o)
		if err := fs.Parse([]string{"--memory-limit=" + in}); err != nil {
			t.Errorf("--memory-limit=%s: %v", in, err)
		} else if o.Limits.MemoryLimit != want {
			t.Errorf("--memory-limit=%s: %d, want %d", in, o.Limits.MemoryLimit, want)
		}
	}
	// --content-bytes-in-flight, of the same type, takes no 0.
	for in, wantErr := range map[string]bool{"48Mi": false, "0": true, "-1": true} {
		var o Options
		fs := flag.NewFlagSet("driver", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		BindFlags(fs, &o)
		if err := fs.Parse([]string{"--content-bytes-in-flight=" + in}); (err != nil) != wantErr {
			t.Errorf("--content-bytes-in-flight=%s: error %v, want an error: %v", in, err, wantErr)
		}
	}
	// --content-capacity takes a positive quantity, or -1.
	for in, want := range map[string]int64{"64Mi": 64 << 20, "-1": NoContentCapacity, "0": 0, "-2": 0} {
		var o Options
		fs := flag.NewFlagSet("driver", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		BindFlags(fs, &o)
		err := fs.Parse([]string{"--content-capacity=" + in})
		if (err != nil) != (want == 0) || (err == nil && o.Volumes.ContentCapacity != want) {
			t.Errorf("--content-capacity=%s: %d, %v; want %d (0: an error)", in, o.Volumes.ContentCapacity, err, want)
		}
	}
	for _, bad := range []string{"-1", "lots", "256MB!"} {
		var o Options
		fs := flag.NewFlagSet("driver", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		BindFlags(fs, &o)
		if err := fs.Parse([]string{"--memory-limit=" + bad}); err == nil {
			t.Errorf("--memory-limit=%s: no error", bad)
		}
	}
}

// --mount-options takes each backend once, each option once and one atime
// mode, all from mount.SafeOptions; anything else is refused at parse time,
// naming the flag and the value.
func TestMountOptionsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want map[string][]string
		err  string // "" for accepted
	}{
		{nil, nil, ""},
		{[]string{"--mount-options=tmpfs=noexec"}, map[string][]string{"tmpfs": {"noexec"}}, ""},
		{[]string{"--mount-options=tmpfs=noexec,noatime,nosymfollow"}, map[string][]string{"tmpfs": {"noexec", "noatime", "nosymfollow"}}, ""},
		{[]string{"--mount-options=tmpfs=relatime,nodiratime", "--mount-options=dir=noexec"}, map[string][]string{"tmpfs": {"relatime", "nodiratime"}, "dir": {"noexec"}}, ""},
		{[]string{"--mount-options=tmpfs=noatime,nodiratime"}, map[string][]string{"tmpfs": {"noatime", "nodiratime"}}, ""}, // redundant, not conflicting

		{[]string{"--mount-options=tmpfs=noexec,noexec"}, nil, `"tmpfs=noexec,noexec": mount option "noexec" is given twice: give it once`},
		{[]string{"--mount-options=tmpfs=noatime,nodiratime,noatime"}, nil, `mount option "noatime" is given twice`},
		{[]string{"--mount-options=tmpfs=noatime,relatime"}, nil, `"tmpfs=noatime,relatime": mount options "noatime" and "relatime" exclude each other: a mount has one atime mode`},
		{[]string{"--mount-options=tmpfs=strictatime,noexec,noatime"}, nil, `"strictatime" and "noatime" exclude each other`},
		{[]string{"--mount-options=tmpfs=relatime,strictatime"}, nil, `"relatime" and "strictatime" exclude each other`},
		{[]string{"--mount-options=tmpfs=exec"}, nil, `mount option "exec" is not one of noexec`},
		{[]string{"--mount-options=tmpfs=suid"}, nil, `mount option "suid" is not one of`},
		{[]string{"--mount-options=tmpfs=noexec,"}, nil, `mount option "" is not one of`},
		{[]string{"--mount-options=tmpfs=noexec", "--mount-options=tmpfs=noatime"}, nil, "the mount options of backend tmpfs are given twice; give them in one value"},
		{[]string{"--mount-options=tmpfs="}, nil, "is not BACKEND=opt[,opt...]"},
		{[]string{"--mount-options==noexec"}, nil, "is not BACKEND=opt[,opt...]"},
		{[]string{"--mount-options=noexec"}, nil, "is not BACKEND=opt[,opt...]"},
	} {
		var o Options
		fs := flag.NewFlagSet("driver", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		BindFlags(fs, &o)
		err := fs.Parse(tc.args)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.err == "" && !maps.EqualFunc(o.Volumes.MountOptions, tc.want, slices.Equal):
			t.Errorf("%q: %v, want %v", tc.args, o.Volumes.MountOptions, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "-mount-options")):
			t.Errorf("%q: %v, want an error about --mount-options containing %q", tc.args, err, tc.err)
		}
	}
}
