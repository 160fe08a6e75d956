package volumetable

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/store"
)

func TestPrint(t *testing.T) {
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	list := &api.VolumeList{Volumes: []api.VolumeInfo{
		{VolumeID: "csi-a", Pod: api.Pod{Namespace: "ns", Name: "web", UID: "u1"}, VolumeName: "scratch", Backend: "tmpfs",
			Size: 64 << 20, Phase: string(store.PhasePublished), Mounted: true, Created: now.Add(-3 * time.Hour), Usage: &api.VolumeUsage{BytesUsed: 3 << 19}},
		{VolumeID: "csi-b", Pod: api.Pod{UID: "u2"}, VolumeName: "cache", Backend: "dir", Phase: string(store.PhasePublished), Rebuilt: true, Created: now.Add(-72 * time.Hour)},
	}}
	var out bytes.Buffer
	if err := Print(&out, Rows("node-1", list), true, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		"NODE VOLUME ID NAMESPACE POD POD UID VOLUME BACKEND SIZE USED PHASE AGE",
		"node-1 csi-a ns web u1 scratch tmpfs 64Mi 1.5Mi Published 3h",
		"node-1 csi-b - - u2 cache dir Published (not mounted) (rebuilt) 3d",
	}
	for i, l := range lines {
		if got := strings.Join(strings.Fields(l), " "); i >= len(want) || got != want[i] {
			t.Errorf("line %d: %q", i, got)
		}
	}
}

func TestFormatting(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1023: "1023", 1024: "1Ki", 64 << 20: "64Mi", 3 << 29: "1.5Gi", 5 << 40: "5Ti"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{45 * time.Second: "45s", 12 * time.Minute: "12m", 5 * time.Hour: "5h", 72 * time.Hour: "3d", -time.Second: "0s"} {
		if got := Age(now, now.Add(-d)); got != want {
			t.Errorf("Age(%s) = %q, want %q", d, got, want)
		}
	}
	if Age(now, time.Time{}) != "-" {
		t.Error("Age of a zero time")
	}
}
