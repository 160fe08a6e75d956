package manifests

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The driver's memory plan (docs/operations.md, "The memory plan";
// framework.MemoryNeeded): Go's soft limit, three quarters of the container
// limit less the content capacity and at least 32Mi below it, must hold the
// content answers in flight at their peak (three times
// --content-bytes-in-flight) and --stats-max-walks walks of 8Mi each; the
// content held in tmpfs volumes (--content-capacity) comes on top. That term
// is the volume-size mode's: in pod-cgroup mode the pods are charged for
// their content, but the shipped plan keeps it, since a node without pod
// cgroups falls back (--pod-cgroups=auto); with --pod-cgroups=required it may
// be small. On Windows no volume is memory-backed: no content is held.
const (
	planInFlight = 48 << 20 // --content-bytes-in-flight's default
	planCapacity = 64 << 20 // --content-capacity's default
	planWalks    = 4        // --stats-max-walks's default
	planWalk     = 8 << 20  // what one walk holds at most
	planReserve  = 32 << 20
)

func memoryNeeded(inFlight, capacity, walks int64) int64 {
	goNeeds := 3*inFlight + walks*planWalk
	return capacity + max((goNeeds*4+2)/3, goNeeds+planReserve)
}

var quantityRE = regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi)?$`)

// quantity parses the forms the manifests use: 320Mi, 1Gi, 335544320.
func quantity(s string) (int64, error) {
	m := quantityRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a quantity of the form 320Mi", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	return n << map[string]int{"": 0, "Ki": 10, "Mi": 20, "Gi": 30}[m[2]], err
}

// checkMemoryPlan: the driver container's memory limit holds the plan of
// the flags it passes (their defaults when it passes none).
func checkMemoryPlan(t *testing.T, ds Object, windows bool) {
	t.Helper()
	containers, _ := ds.Get("spec", "template", "spec", "containers").([]any)
	for _, c := range containers {
		driver := Object(c.(map[string]any))
		if driver.Name2() != "driver" {
			continue
		}
		inFlight, capacity, walks := int64(planInFlight), int64(planCapacity), int64(planWalks)
		args := stringList(driver.Get("args"))
		// The scratch driver (it has --backends) has content only with a
		// --plugin; any other driver may have some.
		scratch, plugins := false, false
		for _, a := range args {
			scratch = scratch || flagName(a) == "--backends"
			plugins = plugins || flagName(a) == "--plugin"
		}
		if scratch && !plugins {
			inFlight, capacity = 0, 0
		}
		for _, a := range args {
			name, v, _ := strings.Cut(a, "=")
			var err error
			switch name {
			case "--content-bytes-in-flight":
				if inFlight > 0 {
					inFlight, err = quantity(v)
				}
			case "--content-capacity":
				if capacity == 0 {
					break
				}
				if v == "-1" {
					t.Errorf("driver: --content-capacity=-1, no bound: no memory limit holds it")
					return
				}
				capacity, err = quantity(v)
			case "--stats-max-walks":
				walks, err = strconv.ParseInt(v, 10, 64)
			}
			if err != nil {
				t.Errorf("driver: %s: %v", a, err)
			}
		}
		if windows {
			capacity = 0
		}
		limit, err := quantity(fmt.Sprint(driver.Get("resources", "limits", "memory")))
		if err != nil {
			t.Errorf("driver: memory limit: %v", err)
			return
		}
		if need := memoryNeeded(inFlight, capacity, walks); limit < need {
			t.Errorf("driver: memory limit %dMi does not hold the memory plan: %dMi (3 × %dMi in flight, %d walks of 8Mi, %dMi content capacity)",
				limit>>20, need>>20, inFlight>>20, walks, capacity>>20)
		}
		return
	}
}

// The plan of the defaults needs more than the 256Mi of before (the
// content capacity came on top) and fits the 320Mi the manifests give.
func TestMemoryPlanDefaults(t *testing.T) {
	need := memoryNeeded(planInFlight, planCapacity, planWalks)
	if need <= 256<<20 || need > 320<<20 {
		t.Errorf("the plan of the defaults needs %dMi, want more than 256Mi and at most 320Mi", need>>20)
	}
}

// The chart computes the driver's memory limit from memoryPlan, keeps a limit
// that holds it, and refuses one that does not.
func TestHelmMemoryPlan(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	limitOf := func(vals map[string]any) string {
		t.Helper()
		ds := helmObjects(t, vals).driverDaemonSet(t)
		containers, _ := ds.Get("spec", "template", "spec", "containers").([]any)
		for _, c := range containers {
			if co := Object(c.(map[string]any)); co.Name2() == "driver" {
				checkMemoryPlan(t, ds, false)
				return fmt.Sprint(co.Get("resources", "limits", "memory"))
			}
		}
		t.Fatal("no driver container")
		return ""
	}
	for want, vals := range map[string]map[string]any{
		"320Mi": nil, // the defaults: 299Mi, rounded up
		"576Mi": {"memoryPlan": map[string]any{"contentBytesInFlightMi": 96, "contentCapacityMi": 128, "statsWalks": 4}},
		// Nodes that all have pod cgroups (docs/operations.md, "The memory
		// plan"): no content is the driver's, the capacity term shrinks.
		"256Mi": {"podCgroups": map[string]any{"mode": "required"}, "memoryPlan": map[string]any{"contentBytesInFlightMi": 48, "contentCapacityMi": 1, "statsWalks": 4}},
		"1Gi":   {"resources": map[string]any{"limits": map[string]any{"memory": "1Gi"}}},
	} {
		if got := limitOf(vals); got != want {
			t.Errorf("%v: driver memory limit %s, want %s", vals, got, want)
		}
	}
	for name, vals := range map[string]map[string]any{
		"a limit under the plan":  {"resources": map[string]any{"limits": map[string]any{"memory": "256Mi"}}},
		"a limit in bytes":        {"resources": map[string]any{"limits": map[string]any{"memory": "335544320"}}},
		"no content capacity":     {"memoryPlan": map[string]any{"contentBytesInFlightMi": 48, "contentCapacityMi": 0, "statsWalks": 4}},
		"capacity as a quantity":  {"memoryPlan": map[string]any{"contentBytesInFlightMi": 48, "contentCapacityMi": "64Mi", "statsWalks": 4}},
		"unknown memoryPlan keys": {"memoryPlan": map[string]any{"contentBytesInFlightMi": 48, "contentCapacityMi": 64, "statsWalks": 4, "walks": 2}},
	} {
		_, err := Helm(filepath.Join(root, Chart), vals, Namespace)
		if err == nil {
			t.Errorf("%s: rendered, want an error", name)
			continue
		}
		if name == "a limit under the plan" && !strings.Contains(err.Error(), "does not hold the driver's memory plan, 299Mi") {
			t.Errorf("%s: %v, want the plan's need named", name, err)
		}
	}
}
