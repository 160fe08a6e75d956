package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
)

// NodesClient reads a node and its CSINode object and patches the node: what
// StartupTaint needs of the API server. Client is one.
type NodesClient interface {
	// GetNode reads the node called name. cached: from the API server's
	// watch cache (resourceVersion=0), which may be a little behind; else
	// the latest.
	GetNode(ctx context.Context, name string, cached bool) (*corev1.Node, error)
	// PatchNode applies the JSON merge patch data to the node called name.
	PatchNode(ctx context.Context, name string, data []byte) error
	// CSINodeDrivers returns the names of the CSI drivers the node's CSINode
	// object (storage.k8s.io/v1) lists: the drivers its kubelet registered.
	// No CSINode yet is no driver, not an error.
	CSINodeDrivers(ctx context.Context, name string) ([]string, error)
}

// Backoff of StartupTaint's retries, jittered (each wait is drawn from half
// to one and a half of the current step).
const (
	defaultTaintInitialBackoff = time.Second
	defaultTaintMaxBackoff     = 30 * time.Second
)

// StartupTaintOptions configure StartupTaint.
type StartupTaintOptions struct {
	// Client reads the node and its CSINode and patches the node. Required.
	Client NodesClient
	// NodeName is the driver's node, framework.Options.Node.ID. Required.
	NodeName string
	// DriverName is the CSI driver name the node's CSINode must list before
	// the taint goes. Required.
	DriverName string
	// Key is the taint's key, e.g. "ephemera.dev/scratch-not-ready". Every
	// taint with this key (whatever its effect and value) is removed, no
	// other. Required: a qualified name (an optional DNS subdomain prefix and
	// "/", then a name).
	Key string
	// InitialBackoff is the first wait between tries; it doubles up to
	// MaxBackoff. Defaults to 1s and 30s.
	InitialBackoff, MaxBackoff time.Duration
	// Logger logs progress. Defaults to klog.Background().
	Logger klog.Logger
}

// StartupTaint removes the node's startup taint once the kubelet has
// registered the driver: node provisioning taints a new node (the kubelet's
// --register-with-taints, or an autoscaler's startup taints) so that the
// scheduler places no pod there before the driver can serve its volumes, and
// the driver lifts it. Run it as one of the driver's Options.Runnables: it
// starts after the startup reconcile, while the driver serves.
//
// Run reads the node (from the API server's cache). Without the taint there is
// nothing to do: one GET per start, the usual case after the node's first
// start. Otherwise it waits until the node's CSINode lists the driver (the
// kubelet writes it after the registration and a successful NodeGetInfo), then
// removes the taint with a JSON merge patch that carries the node's
// resourceVersion (a concurrent change of the node is a 409, and the next try
// reads it again). Every failure is retried with exponential, jittered backoff
// until ctx ends. It never adds a taint, and removes only Key.
//
// The service account needs get and patch on nodes, and get on csinodes
// (storage.k8s.io); deploy/ ships a ValidatingAdmissionPolicy that lets it
// change only this taint, only on its own node (docs/security.md).
type StartupTaint struct {
	opts StartupTaintOptions
	// sleep waits d or until ctx ends (false); a test hook.
	sleep func(ctx context.Context, d time.Duration) bool
}

// NewStartupTaint checks opts. It starts nothing and makes no API call.
func NewStartupTaint(opts StartupTaintOptions) (*StartupTaint, error) {
	var errs []error
	if opts.Client == nil {
		errs = append(errs, errors.New("option Client is required"))
	}
	if opts.NodeName == "" {
		errs = append(errs, errors.New("NodeName is required (the Kubernetes node name, framework.Options.Node.ID)"))
	}
	if opts.DriverName == "" {
		errs = append(errs, errors.New("DriverName is required"))
	}
	if msgs := validation.IsQualifiedName(opts.Key); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("option Key %q is not a taint key: %v", opts.Key, msgs))
	}
	if opts.InitialBackoff < 0 || opts.MaxBackoff < 0 {
		errs = append(errs, fmt.Errorf("InitialBackoff %s and MaxBackoff %s must not be negative (0 takes the defaults)", opts.InitialBackoff, opts.MaxBackoff))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("kube: invalid StartupTaintOptions: %w", err)
	}
	if opts.InitialBackoff == 0 {
		opts.InitialBackoff = defaultTaintInitialBackoff
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = defaultTaintMaxBackoff
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.InitialBackoff)
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	return &StartupTaint{opts: opts, sleep: sleepCtx}, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// jitter draws a wait from [d/2, 3d/2).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d)
}

// Run removes the taint as described on StartupTaint, then waits for ctx to
// end. It returns nil: a taint it could not remove is logged (with the
// reason), and the driver serves either way.
func (s *StartupTaint) Run(ctx context.Context) error {
	log := s.opts.Logger.WithValues(logkeys.Node, s.opts.NodeName, logkeys.Taint, s.opts.Key)
	ctx = klog.NewContext(ctx, log)
	step := s.opts.InitialBackoff
	cached := true
	for try := 1; ; try++ {
		done, err := s.try(ctx, cached)
		if done {
			break
		}
		cached = false // read the latest once something went wrong
		switch {
		case err == nil: // the kubelet has not registered the driver yet
			log.V(2).Info("Waiting for the kubelet to register the driver before removing the startup taint", logkeys.Attempt, try)
		case apierrors.IsConflict(err):
			log.V(2).Info("The node changed while removing the startup taint; trying again", logkeys.Attempt, try)
			step = s.opts.InitialBackoff
		case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
			log.Error(err, "Cannot remove the startup taint: the service account needs get and patch on nodes and get on csinodes.storage.k8s.io, and the admission policy must allow it (deploy/: startupTaint); the node stays unschedulable until then", logkeys.Attempt, try)
		default:
			log.Error(err, "Cannot remove the startup taint yet; trying again", logkeys.Attempt, try)
		}
		if !s.sleep(ctx, jitter(step)) {
			return nil
		}
		step = min(2*step, s.opts.MaxBackoff)
	}
	<-ctx.Done()
	return nil
}

// try makes one attempt: done when the node has no taint with the key (any
// more). A nil error with done false: the driver is not registered yet.
func (s *StartupTaint) try(ctx context.Context, cached bool) (done bool, err error) {
	log := klog.FromContext(ctx)
	c, name := s.opts.Client, s.opts.NodeName
	node, err := c.GetNode(ctx, name, cached)
	if err != nil {
		return false, fmt.Errorf("reading node %s: %w", name, err)
	}
	keep := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == s.opts.Key })
	if len(keep) == len(node.Spec.Taints) {
		log.V(2).Info("The node has no startup taint")
		return true, nil
	}
	drivers, err := c.CSINodeDrivers(ctx, name)
	if err != nil {
		return false, fmt.Errorf("reading CSINode %s: %w", name, err)
	}
	if !slices.Contains(drivers, s.opts.DriverName) {
		return false, nil
	}
	if cached {
		// The patch must carry the node's latest resourceVersion.
		if node, err = c.GetNode(ctx, name, false); err != nil {
			return false, fmt.Errorf("reading node %s: %w", name, err)
		}
		keep = slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == s.opts.Key })
		if len(keep) == len(node.Spec.Taints) {
			return true, nil
		}
	}
	patch, err := taintPatch(node.ResourceVersion, keep)
	if err != nil {
		return false, err
	}
	if err := c.PatchNode(ctx, name, patch); err != nil {
		return false, fmt.Errorf("removing taint %s from node %s: %w", s.opts.Key, name, err)
	}
	log.Info("Removed the startup taint: the kubelet has registered the driver")
	return true, nil
}

// taintPatch is the JSON merge patch that sets the node's taints to keep
// (removes the list when keep is empty), conditional on resourceVersion.
func taintPatch(resourceVersion string, keep []corev1.Taint) ([]byte, error) {
	type spec struct {
		Taints []corev1.Taint `json:"taints"` // null removes the list
	}
	p := struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec spec `json:"spec"`
	}{Spec: spec{Taints: keep}}
	if len(keep) == 0 {
		p.Spec.Taints = nil
	}
	p.Metadata.ResourceVersion = resourceVersion
	return json.Marshal(p)
}
