package framework

import (
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/stats"
)

// The defaults of StatsWalkLimits pass the walks' own check (stats.Limits.Check
// tests the refusals).
func TestStatsWalkLimitsValidate(t *testing.T) {
	var l StatsWalkLimits
	l.setDefaults()
	if l != (StatsWalkLimits{MaxEntries: 1_000_000, MaxDepth: 128, Timeout: 5 * time.Second, MaxConcurrent: 4, MaxLinkedFiles: 1 << 16, CacheTTL: time.Minute}) || stats.Limits(l).Check() != nil {
		t.Errorf("defaults %+v: %v", l, stats.Limits(l).Check())
	}
}
