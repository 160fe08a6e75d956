package kube_test

import (
	"fmt"
	"time"

	"github.com/ephemera-csi/ephemera/framework/kube"
)

// A driver's own start-up work spread as Pods' first list: a delay d drawn
// from [0, least) before asking FleetSize.Size (waiting up to
// kube.FleetSizeWait), then FleetStartRest in the fleet's window.
func ExampleFleetStartRest() {
	least := 5 * time.Second
	d := time.Second // drawn from [0, least): a fifth of it
	for _, drivers := range []int{50, 2000} {
		w := kube.FleetStartJitter(drivers)
		fmt.Printf("%d drivers: window %s, then %s more\n", drivers, w, kube.FleetStartRest(d, least, w))
	}
	// Output:
	// 50 drivers: window 5s, then 0s more
	// 2000 drivers: window 1m40s, then 19s more
}
