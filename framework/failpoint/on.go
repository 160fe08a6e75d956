//go:build failpoints

package failpoint

import (
	"os"
	"strings"
	"sync/atomic"
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

var hook atomic.Pointer[func(name string)]

// SetHook makes Hit call fn with the failpoint's name instead of consulting
// EPHEMERA_FAILPOINT, for tests that run a driver in-process: fn may return
// (carry on) or stop the calling goroutine with runtime.Goexit, which models a
// kill -9 of that operation at that point (its deferred cleanups run, but the
// framework's rollbacks only act on a returned error, so none happens). A nil
// fn restores the environment's failpoints.
func SetHook(fn func(name string)) {
	if fn == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&fn)
}

// Hit kills the process with SIGKILL when name is armed.
func Hit(name string) {
	if fn := hook.Load(); fn != nil {
		(*fn)(name)
		return
	}
	if armed[name] {
		p, _ := os.FindProcess(os.Getpid())
		_ = p.Signal(syscall.SIGKILL)
		select {} // never returns; the signal is on its way
	}
}
