//go:build pprof

package main

import (
	"net/http"
	_ "net/http/pprof" // the profiling handlers on http.DefaultServeMux
	"os"
	"runtime"
)

// With -tags pprof, EPHEMERA_PPROF_ADDR=127.0.0.1:6060 serves /debug/pprof
// for profiling the driver process (test/bench TestKubeletShapedProcess with
// EPHEMERA_BENCH_PROFILE). Never in a shipped binary.
func init() {
	if addr := os.Getenv("EPHEMERA_PPROF_ADDR"); addr != "" {
		runtime.SetBlockProfileRate(10000)
		runtime.SetMutexProfileFraction(5)
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
