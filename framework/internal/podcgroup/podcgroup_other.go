//go:build !linux

package podcgroup

import (
	"context"
	"fmt"
	"os"
	"runtime"
)

// detect: there are no cgroups off Linux (Open says so before).
func detect(string) (Version, error) {
	return Detect, fmt.Errorf("%w: %s has no cgroups", ErrUnsupported, runtime.GOOS)
}

// Write is not supported off Linux: the caller falls back.
func (c *Cgroup) Write(context.Context, *os.File, map[string]File, WriteOptions) (Result, error) {
	return Result{}, fmt.Errorf("%w: %s has no cgroups", ErrUnsupported, runtime.GOOS)
}
