package spread

import "time"

// PerDriver is the window's share of each driver: the drivers of a fleet
// that restart at once start their work at about 1/PerDriver (20) a second
// on average. At 40 a second (25 ms, until issue 47) the fleet simulation's
// restart storms of 1,000 and 2,000 drivers put the kube-system client's p99
// at 2.2 times its steady level on the 2-core machine, where the API
// server's CPU was what the storm cost (docs/operations.md, "At fleet
// scale").
const PerDriver = 50 * time.Millisecond

// Max bounds the window: 6,000 drivers and more spread over five minutes. A
// longer one would delay the first orphan GC pass of the last driver more
// than the GC's own grace period does.
const Max = 5 * time.Minute

// Window is the window over which drivers of a fleet of that many (the
// ones that may start at once: their DaemonSet's desiredNumberScheduled)
// spread their start-up work: drivers × PerDriver, no shorter than least
// (the caller's default) and no longer than Max (or least, if that is
// longer). least <= 0 is no window at all (the caller's "no jitter"),
// whatever the fleet; drivers <= 0 (unknown) is least.
func Window(drivers int, least time.Duration) time.Duration {
	if least <= 0 {
		return 0
	}
	if drivers <= 0 {
		return least
	}
	w := min(time.Duration(drivers)*PerDriver, Max)
	if drivers > int(Max/PerDriver) { // no overflow of the product above
		w = Max
	}
	return max(w, least)
}

// FirstRead is the window over which the drivers of a fleet that remember no
// size spread their one read of it (kube.FleetSize): 30 s, about 170 first
// contacts with the API server a second at 5,000 drivers.
const FirstRead = 30 * time.Second

// SizeTimeout bounds a caller's wait for the fleet's size: a read at its
// point of FirstRead and 10 s for the read itself.
const SizeTimeout = FirstRead + 10*time.Second

// Rest is what a driver waits, once it has learnt the fleet's window w, after
// a delay d drawn from [0, least): the same fraction of w as d is of least,
// less d. When the answer came at once (a remembered size), a fleet's work
// falls uniformly in w. The time the answer took is not taken off: a first
// start's answers come spread over FirstRead, and its work then falls over
// that and w, never faster than a fleet's N/w a second (had it been taken
// off, the work of the drivers whose answer came late would bunch up at the
// end of FirstRead, at up to twice that rate).
func Rest(d, least, w time.Duration) time.Duration {
	if least <= 0 || w <= least {
		return 0
	}
	return max(time.Duration(float64(w)*float64(d)/float64(least))-d, 0)
}
