package daemon

import "testing"

func TestCheckMetricsAddress(t *testing.T) {
	for addr, ok := range map[string]bool{"": true, ":9809": true, "127.0.0.1:0": true, "[::1]:9809": true, "9809": false, ":http": false, "host:99999": false} {
		if err := checkMetricsAddress(addr); (err == nil) != ok {
			t.Errorf("checkMetricsAddress(%q) = %v", addr, err)
		}
	}
}
