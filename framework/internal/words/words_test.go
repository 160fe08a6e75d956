package words

import (
	"errors"
	"testing"
)

func TestWords(t *testing.T) {
	w := New(map[string]string{
		"Limits.MaxInFlight":            "--max-in-flight",
		"Limits.MaxInFlightPerBackend":  "--max-in-flight-per-backend",
		"Observability.CSIDrivers":      "--events or --gc-confirm-with-api",
		"Node.StateDir":                 "--state-dir",
		"Limits.StatsWalk.Timeout":      "--stats-timeout",
		"Observability.MetricsAddress":  "--metrics-address",
		"Limits.Capacity":               "--capacity",
		"Volumes.ContentBytesInFlight":  "--content-bytes-in-flight",
		"Limits.InFlightReservedPerBac": "--never", // a prefix of no whole field: never matches
	})
	for in, want := range map[string]string{
		"Limits.MaxInFlight 0 (--max-in-flight) must be positive":                                                                   "--max-in-flight 0 must be positive",
		"Limits.MaxInFlightPerBackend 9 (--max-in-flight-per-backend) must be between 1 and Limits.MaxInFlight 8 (--max-in-flight)": "--max-in-flight-per-backend 9 must be between 1 and --max-in-flight 8",
		"no API access (Options.Observability.CSIDrivers not set)":                                                                  "no API access (--events or --gc-confirm-with-api not set)",
		`Node.StateDir "rel" must be an absolute path`:                                                                              `--state-dir "rel" must be an absolute path`,
		"Limits.StatsWalk.Timeout 0s must be positive":                                                                              "--stats-timeout 0s must be positive",
		"StatsWalk.Timeout alone is no field path of Options":                                                                       "StatsWalk.Timeout alone is no field path of Options",
		"a budget (Limits.Capacity); retrying does not help":                                                                        "a budget (--capacity); retrying does not help",
		"Limits.InFlightReservedPerBackend 3 (--in-flight-reserved-per-backend)":                                                    "Limits.InFlightReservedPerBackend 3 (--in-flight-reserved-per-backend)",
		"Volumes.ContentBytesInFlight 1Mi (--other-flag) is small":                                                                  "--content-bytes-in-flight 1Mi (--other-flag) is small",
	} {
		if got := w.Say(in); got != want {
			t.Errorf("say(%q)\n = %q\nwant %q", in, got, want)
		}
	}
	// Without recorded flags (a driver built on the SDK alone) nothing changes.
	if got := (Words{}).Say("Limits.MaxInFlight 0 must be positive"); got != "Limits.MaxInFlight 0 must be positive" {
		t.Errorf("zero words: %q", got)
	}
	// err keeps what errors.Is sees.
	base := errors.New("Limits.MaxInFlight 0 must be positive")
	if err := w.Err(base); err.Error() != "--max-in-flight 0 must be positive" || !errors.Is(err, base) {
		t.Errorf("err: %v", err)
	}
}
