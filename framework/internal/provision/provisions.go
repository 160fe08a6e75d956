package provision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// KubeletDeadline is the kubelet's deadline for one NodePublishVolume
// (pkg/volume/csi csiTimeout). A Create still running this long after it
// started is reported slow once (Config.OnSlow).
const KubeletDeadline = 2 * time.Minute

// Config configures Provisions.
type Config struct {
	// OperationTimeout is Options.Limits.OperationTimeout: one publish waits
	// for a background Create at most half of it, the other half is for the
	// mount and the content.
	OperationTimeout time.Duration
	// ProvisionTimeout is Options.Limits.ProvisionTimeout, the bound of one
	// background Create.
	ProvisionTimeout time.Duration
	// MaxPerBackend is Options.Limits.MaxInFlightPerBackend: at most that
	// many Creates of one backend run in the background at once.
	MaxPerBackend int
	// OnSlow posts message about v's Create, still running after
	// KubeletDeadline, to v's pod (the lifecycle's ProvisioningSlow event).
	OnSlow func(pod api.Pod, message string)
}

// provisioned is what a background Create returned: the source to publish
// and v.State as it left it (what Delete needs).
type provisioned struct {
	src   api.Source
	state map[string]string
}

// Provisions runs the Creates of the long-provisioning backends
// (framework.LongProvisioner) in the background, past the NodePublishVolume
// that started them, for the kubelet's next NodePublishVolume of the volume
// to attach to. Set the metrics (SetMetrics) before the first Start.
type Provisions struct {
	cfg       Config
	reg       *Registry[provisioned]
	slowAfter atomic.Int64 // KubeletDeadline; tests scale it (SetSlowAfter)
	metrics   *metrics.Metrics
}

// NewProvisions returns the Provisions of a validated cfg.
func NewProvisions(cfg Config) *Provisions {
	p := &Provisions{cfg: cfg, reg: New[provisioned](cfg.MaxPerBackend)}
	p.slowAfter.Store(int64(KubeletDeadline))
	return p
}

// SetMetrics sets the metrics of the Creates in the background.
func (p *Provisions) SetMetrics(m *metrics.Metrics) { p.metrics = m }

// SetSlowAfter scales KubeletDeadline, after which a background Create is
// reported slow, for later Starts (tests).
func (p *Provisions) SetSlowAfter(after time.Duration) { p.slowAfter.Store(int64(after)) }

// stillProvisioning is the error of a publish that ended while its Create
// goes on in the background: Aborted, nothing rolled back.
type stillProvisioning struct{ msg string }

func (e *stillProvisioning) Error() string { return e.msg }

// IsStillProvisioning reports whether err says that the volume's Create goes
// on in the background.
func IsStillProvisioning(err error) bool {
	var s *stillProvisioning
	return errors.As(err, &s)
}

// wait is how long one publish waits for a background Create.
func (p *Provisions) wait() time.Duration { return p.cfg.OperationTimeout / 2 }

// Start runs create(v) in the background and waits for it at most half of
// Config.OperationTimeout: when it returned, its result (and v.State as it
// left it, into v); else an error that IsStillProvisioning. create gets a
// copy of v and a context that keeps ctx's values, not its deadline.
func (p *Provisions) Start(ctx context.Context, v *api.Volume, create func(context.Context, *api.Volume) (api.Source, error)) (api.Source, error) {
	cv := *v
	cv.State = maps.Clone(v.State) // the background Create's own
	pod, name, backend := v.Pod, v.Name, v.Backend
	slowAfter := time.Duration(p.slowAfter.Load())
	p.metrics.Provisioning(backend, 1)
	op, err := p.reg.Start(ctx, v.ID, backend, Options{
		Timeout:   p.cfg.ProvisionTimeout,
		SlowAfter: slowAfter,
		OnSlow: func() {
			p.cfg.OnSlow(pod, fmt.Sprintf(
				"Volume %s is still being provisioned by backend %s after %s, longer than the kubelet waits for one call: its retries attach to it (at most %s, --provision-timeout)",
				name, backend, slowAfter.Round(time.Second), p.cfg.ProvisionTimeout))
		},
		OnDone: func(error) { p.metrics.Provisioning(backend, -1) },
	}, func(ctx context.Context) (provisioned, error) {
		src, err := create(ctx, &cv)
		return provisioned{src: src, state: cv.State}, err
	})
	if err != nil {
		p.metrics.Provisioning(backend, -1)
		if errors.Is(err, ErrFull) {
			return api.Source{}, errkind.Errorf(api.ErrResourceExhausted, "%d volumes of backend %s are already provisioning in the background on this node, its share (--max-in-flight-per-backend %d); the kubelet retries",
				p.cfg.MaxPerBackend, backend, p.cfg.MaxPerBackend)
		}
		return api.Source{}, errkind.Errorf(api.ErrBusy, "volume %s: %v", v.ID, err)
	}
	return p.await(ctx, v, op)
}

// await waits at most wait for op, the background Create of v, until ctx
// ends. When it returned, its result is taken from the registry: its
// source, and its v.State into v.
func (p *Provisions) await(ctx context.Context, v *api.Volume, op *Op[provisioned]) (api.Source, error) {
	if !op.Wait(ctx, p.wait()) {
		elapsed := op.Elapsed(time.Now())
		if op.Outlived() {
			p.metrics.ProvisionOutlived(v.Backend)
			klog.FromContext(ctx).Info("The volume's Create goes on in the background past the publish; the kubelet's retry attaches to it", logkeys.Duration, elapsed)
		}
		return api.Source{}, errkind.With(api.ErrBusy, &stillProvisioning{fmt.Sprintf(
			"volume %s is still provisioning, %d s so far (backend %s, at most %s: --provision-timeout); the kubelet retries",
			v.ID, int(elapsed.Seconds()), v.Backend, p.cfg.ProvisionTimeout)})
	}
	res, err, ok := p.reg.Take(v.ID)
	if !ok {
		return api.Source{}, errkind.Errorf(errkind.ErrInternal, "volume %s: the result of its background Create is gone", v.ID)
	}
	v.State = res.state
	return res.src, err
}

// Running reports whether volume id has a background Create in the registry
// (running, or returned and not yet attached to).
func (p *Provisions) Running(id string) bool { return p.reg.Get(id) != nil }

// Attach waits for the background Create of v as Start does.
func (p *Provisions) Attach(ctx context.Context, v *api.Volume) (api.Source, error) {
	op := p.reg.Get(v.ID)
	if op == nil {
		return api.Source{}, errkind.Errorf(errkind.ErrInternal, "volume %s: its background Create is gone", v.ID)
	}
	return p.await(ctx, v, op)
}

// Stop cancels the background Create of rec's volume, if any, and waits for
// it to return (at most half of Config.OperationTimeout, within ctx): the
// teardown then deletes what it left, with the v.State it left (into
// rec.State). A Create that does not return in time fails with Aborted (the
// kubelet retries; the Create stays cancelled).
func (p *Provisions) Stop(ctx context.Context, rec *store.Record) error {
	if !p.Running(rec.VolumeID) {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, p.wait())
	defer cancel()
	res, opErr, found, err := p.reg.Cancel(wctx, rec.VolumeID)
	if err != nil {
		return errkind.Errorf(api.ErrBusy, "volume %s: the Create of backend %s was cancelled and has not returned yet; the kubelet retries", rec.VolumeID, rec.Backend)
	}
	if found {
		rec.State = res.state
		klog.FromContext(ctx).V(2).Info("Cancelled the volume's background Create", logkeys.Err, fmt.Sprint(opErr))
	}
	return nil
}

// StopAll cancels the background Creates when the driver stops, and waits a
// little for them: their intent records make the next start roll back what
// they left.
func (p *Provisions) StopAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return p.reg.CancelAll(ctx)
}

// Since marks the volumes of list whose Create runs in the background (GET
// /volumes).
func (p *Provisions) Since(list []api.VolumeInfo) {
	started := p.reg.Started()
	for i := range list {
		if t, ok := started[list[i].VolumeID]; ok {
			list[i].ProvisioningSince = &t
		}
	}
}
