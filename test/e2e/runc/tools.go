//go:build tools

// Package tools pins the runc command built by ../build-runc.sh.
package tools

import (
	_ "github.com/opencontainers/runc"
)
