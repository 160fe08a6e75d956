//go:build linux

package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// TestFirstPublishAfterStart measures what giving the binary's startup pages
// back costs: the driver reads the code of its first calls back a page at a
// time, from the disk when no other process kept those pages. Each trial
// starts the driver (the image's binary, as TestDriverMemory runs it), waits
// for /readyz, and times its first publish and unpublish, then a second pair
// (the code is in by then), through the kubelet simulator; trials with
// --keep-binary-pages alternate with those without. It prints the median and
// the largest of each.
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestFirstPublishAfterStart -v
func TestFirstPublishAfterStart(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 to measure")
	}
	requireRoot(t)
	bin := driverBinary(t) // startDriverProcess writes it back first, as on a node
	const trials = 7
	type times struct{ first, firstUnpub, second, secondUnpub []time.Duration }
	res := map[bool]*times{false: {}, true: {}}
	for i := range 2 * trials {
		keep := i%2 == 1
		r := res[keep]
		d := firstCalls(t, bin, keep)
		r.first, r.firstUnpub = append(r.first, d[0]), append(r.firstUnpub, d[1])
		r.second, r.secondUnpub = append(r.second, d[2]), append(r.secondUnpub, d[3])
	}
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "binary pages\tfirst publish\tfirst unpublish\tsecond publish\tsecond unpublish\t(median / largest of "+strconv.Itoa(trials)+")")
	for _, keep := range []bool{false, true} {
		r, name := res[keep], "given back (default)"
		if keep {
			name = "kept (--keep-binary-pages)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name, medMax(r.first), medMax(r.firstUnpub), medMax(r.second), medMax(r.secondUnpub))
	}
	_ = tw.Flush()
	t.Logf("the first calls after a start, %s:\n%s", bin, out.String())
}

// firstCalls starts the driver and returns the durations of its first
// publish, first unpublish, second publish and second unpublish.
func firstCalls(t *testing.T, bin string, keep bool) [4]time.Duration {
	t.Helper()
	base := shortTempDir(t, "ephemera-first")
	sock := filepath.Join(base, "csi.sock")
	metrics := freeAddr(t)
	args := driverArgs(base, sock, metrics)
	if keep {
		args = append(args, "--keep-binary-pages")
	}
	_, stop := startDriverProcess(t, bin, args, base, nil)
	defer stop()
	waitReady(t, metrics, base)
	k := drivertest.NewKubelet(drivertest.KubeletOptions{
		Root: filepath.Join(base, "kubelet"), Endpoint: "unix://" + sock, DriverName: memDriver, NodeName: memNode,
	})
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{api.ParamSize: "1Mi"}}
	ctx := context.Background()
	var d [4]time.Duration
	for i := range 2 {
		p := k.NewPod("first", "pod-"+strconv.Itoa(i))
		start := time.Now()
		if err := k.Publish(ctx, p, vol); err != nil {
			t.Fatal(err)
		}
		d[2*i] = time.Since(start)
		start = time.Now()
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
		d[2*i+1] = time.Since(start)
	}
	return d
}

// medMax is "median / largest" of ds.
func medMax(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%.1f / %.1f ms", float64(s[len(s)/2])/1e6, float64(s[len(s)-1])/1e6)
}
