package lanes

// DefaultPerBackend is Options.MaxInFlightPerBackend's default
// (framework.LimitOptions.MaxInFlightPerBackend's) for a node-wide
// maxInFlight: half of it, at least 8, at most all of it; all of it for a
// driver of one backend.
func DefaultPerBackend(maxInFlight, backends int) int {
	if backends == 1 {
		return maxInFlight
	}
	return min(maxInFlight, max(8, maxInFlight/2))
}

// DefaultReserved is Options.InFlightReservedPerBackend's default
// (framework.LimitOptions.InFlightReservedPerBackend's): 4, or less where the
// backends' reserves would not fit maxInFlight.
func DefaultReserved(maxInFlight, backends, perBackend int) int {
	if backends == 0 {
		return 0
	}
	return max(0, min(4, maxInFlight/backends, perBackend))
}
