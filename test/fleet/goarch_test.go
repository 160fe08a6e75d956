//go:build fleet

package fleet

import "runtime"

func goarch() string { return runtime.GOARCH }
