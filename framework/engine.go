package framework

import (
	"context"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/daemon"
	"github.com/ephemera-csi/ephemera/framework/internal/fill"
	"github.com/ephemera-csi/ephemera/framework/internal/lifecycle"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
)

// daemonConfig is what Run's components (internal/daemon) take of o, but
// for the CSIDriver check, which is the Driver's (Driver.daemonConfig).
func (o *Options) daemonConfig() daemon.Config {
	sock, _ := daemon.SocketPath(o.Node.Endpoint) // checked by daemon.Config.Check
	cfg := daemon.Config{
		DriverName: o.DriverName,
		Node: daemon.NodeConfig{
			ID: o.Node.ID, Version: o.Node.Version, Endpoint: o.Node.Endpoint, Socket: sock,
			StateDir: o.Node.StateDir, StateFile: StateFile, KubeletRootDir: o.Node.KubeletRootDir,
			RegisterWithKubelet: o.Node.RegisterWithKubelet,
		},
		State: daemon.StateConfig{LockTimeout: o.State.LockTimeout, RefuseDamaged: o.State.Recovery == StateRecoveryRefuse, Recovery: o.State.Recovery},
		Limits: daemon.LimitConfig{
			MemoryLimit: o.Limits.MemoryLimit, MemoryNeeded: o.memoryNeeded(), HeldCapacity: o.heldCapacity(),
			GoMemoryLimit: GoMemoryLimit(o.Limits.MemoryLimit - o.heldCapacity()), KeepBinaryPages: o.Limits.KeepBinaryPages,
		},
		GC:            daemon.GCConfig{Interval: o.GC.Interval},
		Observability: daemon.ObservabilityConfig{Logger: o.Observability.Logger, MetricsAddress: o.Observability.MetricsAddress},
	}
	for _, r := range o.Runnables {
		cfg.Runnables = append(cfg.Runnables, r)
	}
	return cfg
}

// daemonConfig is what Run's components take of d: its options' and the
// startup check of the CSIDriver object.
func (d *Driver) daemonConfig() daemon.Config {
	cfg := d.opts.daemonConfig()
	cfg.Observability.NoCSIDriverCheck = d.words.Say("Not checking the CSIDriver object: no API access (Options.Observability.CSIDrivers not set)")
	if d.opts.Observability.CSIDrivers != nil {
		cfg.Observability.CheckCSIDriver = d.csiDriverCheck().Run
	}
	return cfg
}

// memoryNeeded is MemoryNeeded of o after defaults: without a content
// provider, no content is in flight or held; on Windows none is held.
func (o *Options) memoryNeeded() int64 {
	switch {
	case len(lifecycle.ContentProviders(o.engineConfig())) == 0:
		return MemoryNeeded(0, 0, o.Limits.StatsWalk.MaxConcurrent)
	case o.Volumes.ContentCapacity == NoContentCapacity && !isWindows:
		return -1
	}
	return MemoryNeeded(o.Volumes.ContentBytesInFlight, o.heldCapacity(), o.Limits.StatsWalk.MaxConcurrent)
}

// heldCapacity is the content capacity Go's memory limit leaves out: none
// without a content provider, on Windows (no volume is memory-backed), or
// without a bound (NoContentCapacity: then MemoryNeeded says no limit holds
// the plan, and Go's limit leaves nothing out).
func (o *Options) heldCapacity() int64 {
	if len(lifecycle.ContentProviders(o.engineConfig())) == 0 || isWindows {
		return 0
	}
	return max(o.Volumes.ContentCapacity, 0)
}

// engineConfig is what the lifecycle engine (internal/lifecycle) takes of o.
func (o *Options) engineConfig() *lifecycle.Config {
	backends := make(map[string]lifecycle.Backend, len(o.Backends))
	for name, b := range o.Backends {
		backends[name] = backend{b}
	}
	cfg := &lifecycle.Config{
		DriverName: o.DriverName,
		Windows:    isWindows,
		Node:       lifecycle.NodeConfig{KubeletRootDir: o.Node.KubeletRootDir},
		Backends:   backends,
		Limits: lifecycle.LimitConfig{
			OperationTimeout:           o.Limits.OperationTimeout,
			ProvisionTimeout:           o.Limits.ProvisionTimeout,
			MaxVolumesPerNode:          o.Limits.MaxVolumesPerNode,
			MaxVolumesPerPod:           o.Limits.MaxVolumesPerPod,
			MaxInFlight:                o.Limits.MaxInFlight,
			MaxInFlightPerBackend:      o.Limits.MaxInFlightPerBackend,
			InFlightReservedPerBackend: o.Limits.InFlightReservedPerBackend,
			Capacity:                   o.Limits.Capacity,
			StatsWalk:                  stats.Limits(o.Limits.StatsWalk),
		},
		Volumes: lifecycle.VolumeConfig{
			AcceptedAttributes:   o.Volumes.AcceptedAttributes,
			MountOptions:         o.Volumes.MountOptions,
			ContentTimeout:       o.Volumes.ContentTimeout,
			ContentBytesInFlight: o.Volumes.ContentBytesInFlight,
			ContentCapacity:      o.Volumes.ContentCapacity,
			PodCgroups: fill.PodCgroupConfig{
				Mode:   o.Volumes.PodCgroups.Mode,
				Mount:  o.Volumes.PodCgroups.Mount,
				Root:   o.Volumes.PodCgroups.KubeletCgroupRoot,
				Driver: o.Volumes.PodCgroups.KubeletCgroupDriver,
				Wait:   o.Volumes.PodCgroups.Wait,
			},
			RefreshInterval:    o.Volumes.RefreshInterval,
			RefreshConcurrency: o.Volumes.RefreshConcurrency,
		},
		GC: lifecycle.GCConfig{
			Interval:          o.GC.Interval,
			OrphanGracePeriod: o.GC.OrphanGracePeriod,
			DryRun:            o.GC.DryRun,
			MaxOrphanShare:    o.GC.MaxOrphanShare,
		},
		Observability: lifecycle.ObservabilityConfig{Logger: o.Observability.Logger},
	}
	// Interfaces are set only when non-nil: a nil interface of framework's
	// type would become a non-nil one of the engine's.
	if o.Content != nil {
		cfg.Content = o.Content
	}
	if o.Volumes.Authorizer != nil {
		cfg.Volumes.Authorizer = o.Volumes.Authorizer
	}
	if o.GC.Pods != nil {
		cfg.GC.Pods = o.GC.Pods
	}
	if o.Observability.Events != nil {
		cfg.Observability.Events = o.Observability.Events
	}
	return cfg
}

// parser reads the CSI requests by o (csiserver.Parser).
func (o *Options) parser() *csiserver.Parser {
	return &csiserver.Parser{
		DriverName:     o.DriverName,
		KubeletRootDir: o.Node.KubeletRootDir,
		Windows:        isWindows,
		Own:            csiserver.OwnAttributes(backendNames(o.Backends), o.Volumes.DefaultBackend),
		Declared:       o.Volumes.AcceptedAttributes,
		MaxVolumeSize:  o.Limits.MaxVolumeSize,
		Validate: func(backend string, v *api.Volume) error {
			return ValidateVolume(o.Backends[backend], v)
		},
	}
}

// backend is a driver author's Backend as the engine takes it
// (lifecycle.Backend): each optional interface as As answers it now.
type backend struct{ b Backend }

func (a backend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	return a.b.Create(ctx, v)
}

func (a backend) Delete(ctx context.Context, v *api.Volume) error { return a.b.Delete(ctx, v) }

func (a backend) Lister() lifecycle.Lister {
	if l, ok := As[Lister](a.b); ok {
		return l
	}
	return nil
}

func (a backend) Finder() lifecycle.Finder {
	if f, ok := As[Finder](a.b); ok {
		return f
	}
	return nil
}

func (a backend) MountOnly() bool { return implements[MountOnly](a.b) }

func (a backend) LongProvisioning() bool { return implements[LongProvisioner](a.b) }

func (a backend) Planner() lifecycle.Planner {
	if p, ok := As[Planner](a.b); ok {
		return planner{p}
	}
	return nil
}

func (a backend) Stamper() lifecycle.Stamper {
	if s, ok := As[Stamper](a.b); ok {
		return s
	}
	return nil
}

func (a backend) ContentProvider() lifecycle.ContentProvider {
	if cp, ok := As[ContentProvider](a.b); ok {
		return cp
	}
	return nil
}

func (a backend) Authorizer() lifecycle.Authorizer {
	if au, ok := As[Authorizer](a.b); ok {
		return au
	}
	return nil
}

func (a backend) HealthChecker() lifecycle.HealthChecker {
	if hc, ok := As[HealthChecker](a.b); ok {
		return hc
	}
	return nil
}

func (a backend) Attributes() api.Attributes {
	if ad, ok := As[AttributeDeclarer](a.b); ok {
		return ad.Attributes()
	}
	return nil
}

func (a backend) Unwrap() any { return a.b }

// planner is a Planner as the engine takes it.
type planner struct{ p Planner }

func (p planner) Plan(ctx context.Context, v *api.Volume) (bool, error) {
	plan, err := p.p.Plan(ctx, v)
	return plan.MountOnly, err
}
