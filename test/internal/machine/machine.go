// Package machine reads what the long tests (test/e2e's soak, test/fleet)
// report about the machine they ran on beside their numbers, since these
// machines are shared and noisy.
package machine

import (
	"os"
	"strings"
)

// LoadAvg is the machine's load average over 1, 5 and 15 minutes, as uptime
// prints it ("1.06 4.95 8.60"); "?" when /proc/loadavg cannot be read.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
