package csiserver

import (
	"fmt"
	"slices"
	"strings"
)

// NoMaxVolumeSize is Parser.MaxVolumeSize's value for no cap
// (framework.NoMaxVolumeSize).
const NoMaxVolumeSize = -1

// Check reports the problems of the options a Parser is built from (after
// defaults), naming Options' fields: a default backend that is missing or
// not among the sorted backends, and a maximum volume size that is neither
// positive nor NoMaxVolumeSize.
func Check(backends []string, defaultBackend string, maxVolumeSize int64) []error {
	var errs []error
	if defaultBackend == "" && len(backends) > 1 {
		errs = append(errs, fmt.Errorf("Volumes.DefaultBackend is required with several backends (one of %s)", strings.Join(backends, ", ")))
	} else if !slices.Contains(backends, defaultBackend) && len(backends) > 0 {
		errs = append(errs, fmt.Errorf("Volumes.DefaultBackend %q is not one of the backends (%s)", defaultBackend, strings.Join(backends, ", ")))
	}
	if maxVolumeSize < NoMaxVolumeSize {
		errs = append(errs, fmt.Errorf("Limits.MaxVolumeSize %d must be positive, or NoMaxVolumeSize (-1) for no cap", maxVolumeSize))
	}
	return errs
}
