package capacity

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// TestNeverFits: a volume larger than the backend's whole budget is
// InvalidArgument (retrying does not help), one that does not fit now is
// ResourceExhausted; with the flags recorded, both name --capacity.
func TestNeverFits(t *testing.T) {
	c := New(0, 0, map[string]int64{"tmpfs": 1 << 30}).WithWords(words.New(map[string]string{"Limits.Capacity": "--capacity"}))
	err := c.Reserve("d", "tmpfs", "pod", 2<<30)
	if got := errkind.Code(err); got != codes.InvalidArgument || !strings.Contains(err.Error(), "retrying does not help") || !strings.Contains(err.Error(), "(--capacity)") {
		t.Fatalf("larger than the budget: %v %v, want InvalidArgument saying retrying does not help, naming --capacity", got, err)
	}
	if err := c.Reserve("d", "tmpfs", "pod", 1<<30); err != nil {
		t.Fatal(err)
	}
	err = c.Reserve("d", "tmpfs", "pod", 1)
	if got := errkind.Code(err); got != codes.ResourceExhausted || !errors.Is(err, api.ErrResourceExhausted) || !strings.Contains(err.Error(), "(--capacity)") {
		t.Fatalf("budget in use: %v %v, want ResourceExhausted naming --capacity", got, err)
	}
	// The node's volume limit, as the e2e's kubelet event shows it.
	c = New(1, 0, nil).WithWords(words.New(map[string]string{"Limits.MaxVolumesPerNode": "--max-volumes-per-node"}))
	if err := c.Reserve("d", "tmpfs", "pod", 1); err != nil {
		t.Fatal(err)
	}
	err = c.Reserve("d", "tmpfs", "pod", 1)
	if got := errkind.Code(err); got != codes.ResourceExhausted || !strings.Contains(err.Error(), "its maximum (--max-volumes-per-node 1)") {
		t.Fatalf("volume limit: %v %v, want ResourceExhausted naming --max-volumes-per-node 1", got, err)
	}
}
