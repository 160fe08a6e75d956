package volumetable

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/store"
)

func TestPrint(t *testing.T) {
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	since := now.Add(-130 * time.Second)
	idA := "csi-3f9c0a1b2c3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789ab"
	list := &api.VolumeList{Volumes: []api.VolumeInfo{
		{VolumeID: idA, Pod: api.Pod{Namespace: "ns", Name: "web", UID: "u1"}, VolumeName: "scratch", Backend: "tmpfs", TargetPath: "/k/pods/u1/volumes/x/scratch/mount",
			Size: 64 << 20, Phase: string(store.PhasePublished), Mounted: true, Created: now.Add(-3 * time.Hour), Usage: &api.VolumeUsage{BytesUsed: 3 << 19}},
		{VolumeID: "csi-b", Pod: api.Pod{UID: "u2"}, VolumeName: "cache", Backend: "dir", Phase: string(store.PhasePublished), Rebuilt: true, Created: now.Add(-72 * time.Hour)},
		{VolumeID: "csi-c", Pod: api.Pod{Namespace: "ns", Name: "img", UID: "u3"}, VolumeName: "image", Backend: "unpack", Phase: string(store.PhasePublishing), Created: since, ProvisioningSince: &since},
	}}
	for _, c := range []struct {
		wide bool
		want []string
	}{
		{false, []string{
			"NODE VOLUME ID NAMESPACE POD VOLUME BACKEND SIZE USED PHASE AGE",
			"node-1 csi-3f9c0a1b2c3d ns web scratch tmpfs 64Mi 1.5Mi Published 3h",
			"node-1 csi-b - - cache dir Published (not mounted) (rebuilt) 3d",
			"node-1 csi-c ns img image unpack Publishing (provisioning 2m10s) 2m",
		}},
		{true, []string{
			"NODE VOLUME ID NAMESPACE POD POD UID VOLUME BACKEND SIZE USED PHASE AGE TARGET",
			"node-1 " + idA + " ns web u1 scratch tmpfs 64Mi 1.5Mi Published 3h /k/pods/u1/volumes/x/scratch/mount",
			"node-1 csi-b - - u2 cache dir Published (not mounted) (rebuilt) 3d -",
			"node-1 csi-c ns img u3 image unpack Publishing (provisioning 2m10s) 2m -",
		}},
	} {
		var out bytes.Buffer
		if err := Print(&out, Rows("node-1", list), true, c.wide, now); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != len(c.want) {
			t.Errorf("wide %v: %d lines:\n%s", c.wide, len(lines), out.String())
		}
		for i, l := range lines {
			if got := strings.Join(strings.Fields(l), " "); i >= len(c.want) || got != c.want[i] {
				t.Errorf("wide %v, line %d: %q", c.wide, i, got)
			}
		}
		// The default table fits a terminal; the wide one holds the whole IDs.
		if w := len(lines[1]); !c.wide && w > 120 {
			t.Errorf("a row of the table is %d characters wide:\n%s", w, out.String())
		}
	}
}

func TestShortIDs(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{"csi-0123456789abcdef", "csi-fedcba9876543210"}, []string{"csi-0123456789ab", "csi-fedcba987654"}},
		// Two IDs alike in their first 16 characters get as many more as tells them apart.
		{[]string{"csi-0123456789ab01", "csi-0123456789ab02", "csi-ff"}, []string{"csi-0123456789ab01", "csi-0123456789ab02", "csi-ff"}},
		{[]string{"csi-0123456789ab0x1", "csi-0123456789ab0y2"}, []string{"csi-0123456789ab0x", "csi-0123456789ab0y"}},
		// The same ID twice (two nodes) stays short.
		{[]string{"csi-0123456789abcdef", "csi-0123456789abcdef"}, []string{"csi-0123456789ab", "csi-0123456789ab"}},
		{nil, []string{}},
	} {
		if got := ShortIDs(c.in); !slices.Equal(got, c.want) {
			t.Errorf("ShortIDs(%q) = %q, want %q", c.in, got, c.want)
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
