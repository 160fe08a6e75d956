package stats

import (
	"testing"
	"time"
)

func TestLimitsCheck(t *testing.T) {
	good := Limits{MaxEntries: 1_000_000, MaxDepth: 128, Timeout: 5 * time.Second, MaxConcurrent: 4, MaxLinkedFiles: 1 << 16, CacheTTL: time.Minute}
	if err := good.Check(); err != nil {
		t.Errorf("%+v: %v", good, err)
	}
	for _, bad := range []Limits{
		{MaxEntries: -1, MaxDepth: 1, Timeout: time.Second},
		{MaxEntries: 1, MaxDepth: -1, Timeout: time.Second},
		{MaxEntries: 1, MaxDepth: 1, Timeout: -time.Second},
		{MaxEntries: 1, MaxDepth: 1, Timeout: 2 * time.Minute},
		{MaxEntries: 1, MaxDepth: 1, Timeout: time.Second, MaxConcurrent: -1},
		{MaxEntries: 1, MaxDepth: 1, Timeout: time.Second, MaxLinkedFiles: -1},
	} {
		if bad.Check() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
