//go:build fleet

package fleet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFleetSmoke is make bench-fleet-smoke (and a step of make test): a small
// fleet (EPHEMERA_FLEET_NODES, default 20, of EPHEMERA_FLEET_PODS pods, 30)
// whose drivers all restart at once, without jitter, and the exact API server
// counts of that restart that make a driver's start O(its node's pods): each
// driver's one pod LIST is served from the watch cache's spec.nodeName index
// and fetches exactly its node's pods, its own among them (N·(pods+1) objects
// in all, not N·N·(pods+1)),
// its watch starts from the list's resource version (no watch-list: zero
// initial events), and it reads its CSIDriver object once. A change that
// brings back a cluster-wide refill (a watch-list, a list without the
// node's field selector) fails here, in about a minute, before any bench.
func TestFleetSmoke(t *testing.T) {
	if os.Getenv("EPHEMERA_FLEET_SMOKE") == "" {
		t.Skip("the fleet smoke test: make bench-fleet-smoke (EPHEMERA_FLEET_SMOKE=1)")
	}
	repo, _ := filepath.Abs("../..")
	nodes := envInt("EPHEMERA_FLEET_NODES", 20)
	perNode := envInt("EPHEMERA_FLEET_PODS", 30)
	began := time.Now()
	f := newFleet(t, repo, nodes, perNode)
	ctx := t.Context()
	t.Logf("API server up, %d pods on %d nodes, after %s", nodes*perNode, nodes, time.Since(began).Round(100*time.Millisecond))

	shipped := mode{name: "list, then watch, no jitter"}
	f.startDrivers(ctx, shipped)
	f.waitSynced(time.Minute)
	t.Cleanup(f.stopDrivers)

	f.stopDrivers()
	before := f.snap()
	f.startDrivers(ctx, shipped)
	f.waitSynced(time.Minute)
	// Every watch open and every CSIDriver read done.
	deadline := time.Now().Add(30 * time.Second)
	var r phaseResult
	for {
		r = diff("restart storm (smoke)", nodes, before, f.snap())
		if (r.values["pod watches open"] >= float64(nodes) && r.byVerb["GET csidrivers 200"] >= float64(nodes)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("\n%s", r)

	want := []struct {
		measure string
		want    float64
		why     string
	}{
		{"pod lists from the watch cache", float64(nodes), "one LIST of its node's pods per driver"},
		{"  of them by the spec.nodeName index", float64(nodes), "every driver's LIST takes the watch cache's spec.nodeName index, not a walk of the cluster's pods"},
		{"pod list objects fetched", float64(nodes * (perNode + 1)), fmt.Sprintf("each driver's LIST fetches its node's %d pods and its own: a cluster-wide list or refill fetches %d per driver", perNode, nodes*(perNode+1))},
		{"pod list objects returned", float64(nodes * (perNode + 1)), "each driver gets its node's pods and its own"},
		{"pod init events", 0, "the watch starts from the LIST's resource version: a watch-list (sendInitialEvents) walks every pod of the cluster per driver"},
		{"APF rejected", 0, "no request refused (429)"},
	}
	for _, w := range want {
		if got := r.values[w.measure]; got != w.want {
			t.Errorf("restart of %d drivers (%d pods per node): %s = %.0f, want exactly %.0f: %s",
				nodes, perNode, strings.TrimSpace(w.measure), got, w.want, w.why)
		}
	}
	if got := r.byVerb["GET csidrivers 200"]; got != float64(nodes) {
		t.Errorf("restart of %d drivers: %.0f CSIDriver reads, want exactly one per driver", nodes, got)
	}
	t.Logf("smoke: %d nodes, %d pods, %s in all", nodes, nodes*perNode, time.Since(began).Round(100*time.Millisecond))
}
