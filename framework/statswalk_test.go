package framework

import (
	"testing"
	"time"
)

func TestStatsWalkLimitsValidate(t *testing.T) {
	var l StatsWalkLimits
	l.setDefaults()
	if l != (StatsWalkLimits{MaxEntries: 1_000_000, MaxDepth: 128, Timeout: 5 * time.Second, MaxConcurrent: 4, MaxLinkedFiles: 1 << 16, CacheTTL: time.Minute}) || l.validate() != nil {
		t.Errorf("defaults %+v: %v", l, l.validate())
	}
	for _, bad := range []StatsWalkLimits{
		{MaxEntries: -1, MaxDepth: 1, Timeout: time.Second},
		{MaxEntries: 1, MaxDepth: -1, Timeout: time.Second},
		{MaxEntries: 1, MaxDepth: 1, Timeout: -time.Second},
		{MaxEntries: 1, MaxDepth: 1, Timeout: 2 * time.Minute},
		{MaxEntries: 1, MaxDepth: 1, Timeout: time.Second, MaxConcurrent: -1},
		{MaxEntries: 1, MaxDepth: 1, Timeout: time.Second, MaxLinkedFiles: -1},
	} {
		if bad.validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
