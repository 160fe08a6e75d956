package lifecycle

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// NoMaxVolumesPerPod is LimitConfig.MaxVolumesPerPod for no cap
// (framework.NoMaxVolumesPerPod).
const NoMaxVolumesPerPod = -1

// MaxProvisionTimeout is the longest LimitConfig.ProvisionTimeout.
const MaxProvisionTimeout = time.Hour

// Check reports every problem of c (after defaults), naming Options'
// fields and flags: the backends and their attributes, the capacity and
// the lanes, the content's timeout, budget and capacity, the GC, the
// refreshes, the mount options, the timeouts and the stats walks.
func (c *Config) Check() []error {
	var errs []error
	if len(c.Backends) == 0 {
		errs = append(errs, errors.New("at least one backend is required"))
	}
	for name, b := range c.Backends {
		if name == "" || strings.ContainsAny(name, " ,=/\\") {
			errs = append(errs, fmt.Errorf("backend name %q must be non-empty without spaces, commas, '=' or slashes", name))
		}
		if b == nil || b.Unwrap() == nil {
			errs = append(errs, fmt.Errorf("backend %q is nil", name))
		}
	}
	if err := c.Volumes.AcceptedAttributes.Check(); err != nil {
		errs = append(errs, fmt.Errorf("Volumes.AcceptedAttributes: %w", err))
	}
	errs = append(errs, c.checkDeclarations()...)
	if err := c.checkCapacity(); err != nil {
		errs = append(errs, err)
	}
	if c.Limits.MaxVolumesPerNode < 0 {
		errs = append(errs, errors.New("Limits.MaxVolumesPerNode must not be negative"))
	}
	if err := c.checkLanes(); err != nil {
		errs = append(errs, err)
	}
	if c.Volumes.ContentTimeout < 0 || c.Volumes.ContentTimeout >= c.Limits.OperationTimeout {
		errs = append(errs, fmt.Errorf("Volumes.ContentTimeout %s must be positive and below Limits.OperationTimeout %s", c.Volumes.ContentTimeout, c.Limits.OperationTimeout))
	}
	if c.GC.MaxOrphanShare < 0 || c.GC.MaxOrphanShare > 1 {
		errs = append(errs, fmt.Errorf("GC.MaxOrphanShare %v must be between 0 and 1", c.GC.MaxOrphanShare))
	}
	if c.Volumes.RefreshInterval < 0 || c.Volumes.RefreshConcurrency < 0 {
		errs = append(errs, errors.New("Volumes.RefreshInterval and Volumes.RefreshConcurrency must not be negative"))
	}
	errs = append(errs, c.checkContentBounds()...)
	if err := c.providers().CheckShares(c.Volumes.ContentBytesInFlight); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.checkMountOptions()...)
	if c.Limits.OperationTimeout < 0 || c.Limits.OperationTimeout >= 2*time.Minute {
		errs = append(errs, fmt.Errorf("Limits.OperationTimeout %s must be below the kubelet's 2m deadline", c.Limits.OperationTimeout))
	}
	if c.Limits.ProvisionTimeout < c.Limits.OperationTimeout || c.Limits.ProvisionTimeout > MaxProvisionTimeout {
		errs = append(errs, fmt.Errorf("Limits.ProvisionTimeout %s must be between Limits.OperationTimeout %s and %s", c.Limits.ProvisionTimeout, c.Limits.OperationTimeout, MaxProvisionTimeout))
	}
	if err := c.Limits.StatsWalk.Check(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// checkDeclarations reports a backend declaration that cannot work, and a
// driver attribute a backend declares too.
func (c *Config) checkDeclarations() []error {
	var errs []error
	driver := c.Volumes.AcceptedAttributes.Keys()
	for _, name := range backendNames(c.Backends) {
		b := c.Backends[name]
		if b == nil {
			continue
		}
		attrs := b.Attributes()
		if attrs == nil {
			continue
		}
		if err := attrs.Check(); err != nil {
			errs = append(errs, fmt.Errorf("backend %q: Attributes: %w", name, err))
		}
		for _, k := range attrs.Keys() {
			if slices.Contains(driver, k) {
				errs = append(errs, fmt.Errorf("option Attributes: attribute %q is backend %q's; declare another key", k, name))
			}
		}
	}
	return errs
}

// checkCapacity checks Limits.Capacity against the backends.
func (c *Config) checkCapacity() error {
	for name, n := range c.Limits.Capacity {
		if _, ok := c.Backends[name]; !ok {
			return fmt.Errorf("Limits.Capacity names backend %q, which the driver does not have", name)
		}
		if n <= 0 {
			return fmt.Errorf("Limits.Capacity for backend %q must be positive, got %d", name, n)
		}
	}
	return nil
}

// checkLanes checks the lanes' limits and the volumes per pod.
func (c *Config) checkLanes() error {
	l, backends := &c.Limits, len(c.Backends)
	switch {
	case l.MaxInFlight <= 0:
		return fmt.Errorf("Limits.MaxInFlight %d (--max-in-flight) must be positive", l.MaxInFlight)
	case l.MaxInFlightPerBackend <= 0 || l.MaxInFlightPerBackend > l.MaxInFlight:
		return fmt.Errorf("Limits.MaxInFlightPerBackend %d (--max-in-flight-per-backend) must be between 1 and Limits.MaxInFlight %d (--max-in-flight)", l.MaxInFlightPerBackend, l.MaxInFlight)
	case l.InFlightReservedPerBackend < 0 || l.InFlightReservedPerBackend > l.MaxInFlightPerBackend:
		return fmt.Errorf("Limits.InFlightReservedPerBackend %d (--in-flight-reserved-per-backend) must be between 0 and Limits.MaxInFlightPerBackend %d (--max-in-flight-per-backend)", l.InFlightReservedPerBackend, l.MaxInFlightPerBackend)
	case int64(l.InFlightReservedPerBackend)*int64(backends) > int64(l.MaxInFlight):
		return fmt.Errorf("Limits.InFlightReservedPerBackend %d (--in-flight-reserved-per-backend) for each of %d backends is %d slots, more than Limits.MaxInFlight %d (--max-in-flight): lower the one or raise the other",
			l.InFlightReservedPerBackend, backends, l.InFlightReservedPerBackend*backends, l.MaxInFlight)
	case l.MaxVolumesPerPod < NoMaxVolumesPerPod || l.MaxVolumesPerPod > math.MaxInt32:
		return fmt.Errorf("Limits.MaxVolumesPerPod %d (--max-volumes-per-pod) must be positive, or NoMaxVolumesPerPod (-1) for no cap", l.MaxVolumesPerPod)
	}
	return nil
}

// checkContentBounds checks the content budget and capacity, and that every
// content provider's bound fits Volumes.ContentBytesInFlight: a bound beyond
// it could never be reserved.
func (c *Config) checkContentBounds() []error {
	if c.Volumes.ContentBytesInFlight < 0 {
		return []error{fmt.Errorf("Volumes.ContentBytesInFlight %d must be positive", c.Volumes.ContentBytesInFlight)}
	}
	var errs []error
	if c.Volumes.ContentCapacity < lanes.NoContentCapacity {
		errs = append(errs, fmt.Errorf("Volumes.ContentCapacity %d (--content-capacity) must be positive, or NoContentCapacity (-1) for no bound", c.Volumes.ContentCapacity))
	}
	check := func(what string, x any) {
		// Static: a plugin's handshake, which says whether it provides content,
		// is not known yet.
		if cb, ok := x.(ContentBounder); ok && cb.ContentLimits().MaxBytes > c.Volumes.ContentBytesInFlight {
			errs = append(errs, fmt.Errorf("%s bounds its content answers at %d bytes, beyond Volumes.ContentBytesInFlight %d (--content-bytes-in-flight): raise the budget (and the driver's memory limit, about three times the budget) or lower the bound",
				what, cb.ContentLimits().MaxBytes, c.Volumes.ContentBytesInFlight))
		}
	}
	if c.Content != nil {
		check("option Content", c.Content)
	}
	for _, name := range backendNames(c.Backends) {
		if b := c.Backends[name]; b != nil {
			check("backend "+name, b.Unwrap())
		}
	}
	return errs
}

// checkMountOptions checks Volumes.MountOptions: backends of the driver,
// options of mount.SafeOptions, on Linux only.
func (c *Config) checkMountOptions() []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Volumes.MountOptions)) {
		switch _, ok := c.Backends[name]; {
		case !ok:
			errs = append(errs, fmt.Errorf("Volumes.MountOptions: %q is not one of the backends (%s)", name, strings.Join(backendNames(c.Backends), ", ")))
		case c.Windows && len(c.Volumes.MountOptions[name]) > 0:
			errs = append(errs, fmt.Errorf("Volumes.MountOptions of backend %s: mount options are Linux only", name))
		default:
			if err := mount.CheckOptions(c.Volumes.MountOptions[name]); err != nil {
				errs = append(errs, fmt.Errorf("Volumes.MountOptions of backend %s: %w", name, err))
			}
		}
	}
	return errs
}
