package volume

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

// TestKubeletIndex: the index holds exactly the volumes whose vol_data.json
// names this driver and the handle of their own target.
func TestKubeletIndex(t *testing.T) {
	root := t.TempDir()
	uid := "0b7a4c2e-1f2d-4e5a-9c3b-7d8e9f0a1b2c"
	write := func(vol string, data any) string {
		target := TargetPath(root, uid, vol)
		if err := os.MkdirAll(target, 0o750); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(data)
		if s, ok := data.(string); ok {
			b = []byte(s)
		}
		if err := os.WriteFile(filepath.Join(filepath.Dir(target), VolDataFile), b, 0o640); err != nil {
			t.Fatal(err)
		}
		return target
	}
	ours := write("ours", map[string]string{"driverName": "d.example", "volumeHandle": api.VolumeHandle(uid, "ours")})
	write("other-driver", map[string]string{"driverName": "x.example", "volumeHandle": api.VolumeHandle(uid, "other-driver")})
	write("other-handle", map[string]string{"driverName": "d.example", "volumeHandle": api.VolumeHandle(uid, "ours")})
	write("garbage", "{")
	if err := os.MkdirAll(filepath.Join(root, PodsDir, "not-a-uid", VolumesDir, PluginDir, "v"), 0o750); err != nil {
		t.Fatal(err)
	}
	k := Kubelet{Root: root, Driver: "d.example", Open: func(_, dir string) (*os.Root, error) { return os.OpenRoot(dir) }}
	index, err := k.Index()
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{api.VolumeHandle(uid, "ours"): ours}; !maps.Equal(index, want) {
		t.Fatalf("index %v, want %v", index, want)
	}
	if _, _, ok := k.Owned(TargetPath(root, uid, "garbage")); ok {
		t.Fatal("a target with a vol_data.json that is not JSON is owned")
	}
	empty, err := Kubelet{Root: t.TempDir(), Driver: "d.example", Open: k.Open}.Index()
	if err != nil || len(empty) != 0 {
		t.Fatalf("a kubelet root without pods: %v, %v", empty, err)
	}
}
