//go:build failpoints

package failpoint

import (
	"os"
	"strings"
	"syscall"
)

// Enabled reports whether failpoints are compiled in.
const Enabled = true

var armed = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("EPHEMERA_FAILPOINT"), ",") {
		if n != "" {
			m[n] = true
		}
	}
	return m
}()

// Hit kills the process with SIGKILL when name is armed.
func Hit(name string) {
	if armed[name] {
		p, _ := os.FindProcess(os.Getpid())
		_ = p.Signal(syscall.SIGKILL)
		select {} // never returns; the signal is on its way
	}
}
