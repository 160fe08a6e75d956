package daemon

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// The values of StateConfig.Recovery (framework.StateRecoveryRebuild and
// framework.StateRecoveryRefuse).
const (
	RecoveryRebuild = "rebuild"
	RecoveryRefuse  = "refuse"
)

// Check reports every problem of the process's part of the options (after
// defaults), naming Options' fields: the driver name, the node's ID, endpoint
// and directories, the memory limit, the state recovery and the metrics
// address, in that order.
func (c *Config) Check() []error {
	var errs []error
	if c.DriverName == "" {
		errs = append(errs, errors.New("DriverName is required"))
	} else if err := api.ValidateDriverName(c.DriverName); err != nil {
		errs = append(errs, fmt.Errorf("DriverName %w", err))
	}
	if c.Node.ID == "" {
		errs = append(errs, errors.New("Node.ID is required (normally the node name, e.g. from the downward API spec.nodeName)"))
	}
	if _, err := SocketPath(c.Node.Endpoint); err != nil {
		errs = append(errs, err)
	}
	if !isAbs(c.Node.StateDir) {
		errs = append(errs, fmt.Errorf("Node.StateDir %q must be an absolute path", c.Node.StateDir))
	}
	if !isAbs(c.Node.KubeletRootDir) {
		errs = append(errs, fmt.Errorf("Node.KubeletRootDir %q must be an absolute path", c.Node.KubeletRootDir))
	}
	if l := c.Limits; l.MemoryLimit < 0 || (l.MemoryLimit > 0 && GoMemoryLimit(l.MemoryLimit) <= 0) {
		errs = append(errs, fmt.Errorf("Limits.MemoryLimit %d is too small for the driver: give the container more than 32 MiB, or 0 to leave Go's memory limit alone", l.MemoryLimit))
	} else if l.MemoryLimit > 0 && GoMemoryLimit(l.MemoryLimit-l.HeldCapacity) <= 0 {
		errs = append(errs, fmt.Errorf("Limits.MemoryLimit %s (--memory-limit) leaves the driver nothing beside Volumes.ContentCapacity %s (--content-capacity), the content its volumes may hold in memory: raise the one or lower the other",
			words.Bytes(l.MemoryLimit), words.Bytes(l.HeldCapacity)))
	}
	if r := c.State.Recovery; r != RecoveryRebuild && r != RecoveryRefuse {
		errs = append(errs, fmt.Errorf("State.Recovery %q must be %q or %q", r, RecoveryRebuild, RecoveryRefuse))
	}
	if err := checkMetricsAddress(c.Observability.MetricsAddress); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// GoMemoryLimit is framework.GoMemoryLimit (which documents it): three
// quarters of containerLimit, and at least GoReserve below it.
func GoMemoryLimit(containerLimit int64) int64 {
	return min(containerLimit-containerLimit/4, containerLimit-GoReserve)
}

// GoReserve is what GoMemoryLimit leaves at least: the binary's pages,
// state.db's, what Go does not allocate.
const GoReserve = 32 << 20

// SocketPath extracts the socket path from a "unix://" endpoint
// (Options.Node.Endpoint).
func SocketPath(endpoint string) (string, error) {
	p, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		p, ok = strings.CutPrefix(endpoint, "unix:")
	}
	if !ok || !isAbs(p) {
		return "", fmt.Errorf("Node.Endpoint %q must be unix:// followed by an absolute socket path", endpoint)
	}
	if len(p) > 107 {
		return "", fmt.Errorf("Node.Endpoint: socket path %q is %d bytes; unix sockets allow at most 107", p, len(p))
	}
	return p, nil
}

func isAbs(p string) bool {
	if runtime.GOOS == "windows" {
		return filepath.IsAbs(p) || strings.HasPrefix(p, `\`) || strings.HasPrefix(p, "/")
	}
	return filepath.IsAbs(p)
}

// checkMetricsAddress accepts "" and "host:port" with a numeric port.
func checkMetricsAddress(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return fmt.Errorf("Observability.MetricsAddress %q must be host:port, e.g. \":9809\" or \"127.0.0.1:9809\"", addr)
	}
	return nil
}
