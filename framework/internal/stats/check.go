package stats

import (
	"errors"
	"fmt"
	"time"
)

// MaxTimeout is the longest Limits.Timeout: a walk's answer is for the
// kubelet's stats call, which does not wait longer.
const MaxTimeout = time.Minute

// Check reports what is wrong with l after its defaults
// (framework.Options.Limits.StatsWalk), naming the options' fields.
func (l Limits) Check() error {
	var errs []error
	if l.MaxEntries < 0 || l.MaxDepth < 0 {
		errs = append(errs, fmt.Errorf("Limits.StatsWalk.MaxEntries %d and Limits.StatsWalk.MaxDepth %d must not be negative", l.MaxEntries, l.MaxDepth))
	}
	if l.MaxConcurrent < 0 || l.MaxLinkedFiles < 0 {
		errs = append(errs, fmt.Errorf("Limits.StatsWalk.MaxConcurrent %d (--stats-max-walks) and Limits.StatsWalk.MaxLinkedFiles %d (--stats-max-linked-files) must not be negative", l.MaxConcurrent, l.MaxLinkedFiles))
	}
	if l.Timeout < 0 || l.Timeout > MaxTimeout {
		errs = append(errs, fmt.Errorf("Limits.StatsWalk.Timeout %s must be positive and at most %s", l.Timeout, MaxTimeout))
	}
	return errors.Join(errs...)
}
