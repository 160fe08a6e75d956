package machine

import (
	"strconv"
	"strings"
	"testing"
)

func TestLoadAvg(t *testing.T) {
	got := LoadAvg()
	f := strings.Fields(got)
	if len(f) != 3 {
		t.Fatalf("LoadAvg() = %q, want three fields", got)
	}
	for _, x := range f {
		if v, err := strconv.ParseFloat(x, 64); err != nil || v < 0 {
			t.Errorf("LoadAvg() = %q: field %q is not a load", got, x)
		}
	}
}
