package lifecycle

import (
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

// The Windows rules are the Config's (framework's isWindows, passed down),
// so they are tested on any system: mount options are Linux only.
func TestMountOptionsAreLinuxOnly(t *testing.T) {
	for _, windows := range []bool{false, true} {
		c := Config{
			Windows:  windows,
			Backends: map[string]Backend{"tmpfs": static{}},
			Volumes:  VolumeConfig{MountOptions: map[string][]string{"tmpfs": {mount.SafeOptions[0]}}},
		}
		errs := c.checkMountOptions()
		switch {
		case !windows && len(errs) != 0:
			t.Errorf("a safe mount option on Linux: %v", errs)
		case windows && (len(errs) != 1 || !strings.Contains(errs[0].Error(), "Linux only")):
			t.Errorf("a mount option on Windows: %v, want it refused as Linux only", errs)
		}
	}
}
