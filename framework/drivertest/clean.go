package drivertest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// RequireClean checks that the driver and the Kubelet left nothing behind, and
// otherwise reports each thing left with t.Errorf and stops the test with
// t.FailNow. Nothing is left when there is:
//
//   - no mount point below the kubelet root, on the host (except those already
//     there when Start ran) or, when Options.Volumes.Mounter is a mount.Fake, in the
//     Fake;
//   - no target that the Kubelet sent in a NodePublishVolume, on disk or in the
//     Fake, and nothing in <root>/pods: every pod was deleted
//     ([Kubelet.DeletePod]) and its directories removed;
//   - no record in the driver's state ([framework.Driver.Records]);
//   - for each backend that is a [framework.Lister], nothing in its inventory
//     but the volumes that records refer to (those are reported as records).
//
// Call it after the test deleted its pods, while the driver serves: at the end
// of the test, or in a function passed to t.Cleanup after Start (cleanups run
// last-in first-out, so the driver still serves then). It looks once and does
// not wait for the driver's garbage collector. It must be called from the
// goroutine running the test.
func (h *Harness) RequireClean(t testing.TB) {
	t.Helper()
	// Not t.Context(): that is canceled before the cleanups run.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	left, err := h.leftovers(ctx)
	for _, l := range left {
		t.Errorf("drivertest: left behind: %s", l)
	}
	if err != nil {
		t.Errorf("drivertest: RequireClean could not check everything: %v", err)
	}
	if len(left) > 0 || err != nil {
		t.FailNow()
	}
}

// leftovers lists what RequireClean reports, mounts first, then targets, pod
// directories, records and backend storage, each group sorted. The error tells
// what could not be checked.
func (h *Harness) leftovers(ctx context.Context) ([]string, error) {
	var (
		out  []string
		errs []error
	)
	root := h.Kubelet.Root()

	mounted := map[string]bool{}
	onHost, err := mountPointsUnder(root)
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the mount points below %s: %w", root, err))
	}
	for p := range onHost {
		if !h.before[p] {
			mounted[p] = true
		}
	}
	if h.fake != nil {
		for _, p := range h.fake.MountedTargets() {
			if strings.HasPrefix(p, root+string(filepath.Separator)) {
				mounted[p] = true
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(mounted)) {
		out = append(out, "mount at "+p)
	}

	for _, target := range h.Kubelet.sentTargets() {
		if !mounted[target] && (exists(target) || h.fake != nil && h.fake.DirExists(target)) {
			out = append(out, "target "+target)
		}
	}

	podsDir := filepath.Join(root, volume.PodsDir)
	entries, err := os.ReadDir(podsDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries { // sorted by name
		out = append(out, "pod directory "+filepath.Join(podsDir, e.Name()))
	}

	recs, err := h.driver.Records(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the driver's records: %w", err))
	}
	claimed := map[string]map[string]bool{} // backend name -> volume IDs
	for _, r := range recs {
		out = append(out, fmt.Sprintf("record %s (backend %q, phase %s, target %s)", r.VolumeID, r.Backend, r.Phase, r.TargetPath))
		if claimed[r.Backend] == nil {
			claimed[r.Backend] = map[string]bool{}
		}
		claimed[r.Backend][r.VolumeID] = true
	}

	for _, name := range slices.Sorted(maps.Keys(h.Options.Backends)) {
		l, ok := h.Options.Backends[name].(framework.Lister)
		if !ok {
			continue
		}
		ids, err := l.List(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing the storage of backend %q: %w", name, err))
			continue
		}
		slices.Sort(ids)
		for _, id := range ids {
			if !claimed[name][id] {
				out = append(out, fmt.Sprintf("storage %s of backend %q without a record", id, name))
			}
		}
	}
	return out, errors.Join(errs...)
}
