package lifecycle

import (
	"context"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/fill"
	"github.com/ephemera-csi/ephemera/framework/internal/reconcile"
	"github.com/ephemera-csi/ephemera/framework/internal/storage"
)

// Backend is a volume backend as the lifecycle uses it. The framework's
// adapter (package framework) wraps a driver author's framework.Backend and
// answers each optional interface at the time of asking, as framework.As
// does: nil (false) when the backend does not implement it now.
type Backend interface {
	// Create, Delete and the storage's optional interfaces (Lister, Finder,
	// MountOnly): what internal/storage calls.
	storage.Backend
	// LongProvisioning reports whether Create may outlive the call
	// (framework.LongProvisioner).
	LongProvisioning() bool
	Planner() Planner
	Stamper() Stamper
	ContentProvider() ContentProvider
	Authorizer() Authorizer
	HealthChecker() HealthChecker
	// Attributes are the attributes the backend declares (nil: none).
	Attributes() api.Attributes
	// Unwrap is the author's backend, for what is decided once from its
	// static type (the content parties of the lanes).
	Unwrap() any
}

// The optional interfaces, with the method sets of framework's (which
// document them).
type (
	Lister  = storage.Lister
	Finder  = storage.Finder
	Planner interface {
		// Plan says whether Create will only mount (framework.Plan.MountOnly).
		Plan(ctx context.Context, v *api.Volume) (mountOnly bool, err error)
	}
	Stamper         = reconcile.Stamper
	ContentProvider = fill.ContentProvider
	ContentBounder  = fill.ContentBounder
	HealthChecker   interface {
		Check(ctx context.Context, v *api.Volume) error
	}
	Authorizer interface {
		Authorize(ctx context.Context, v *api.Volume) error
	}
	// PodChecker asks the API server whether a pod exists.
	PodChecker = reconcile.PodChecker
	// EventSink posts events on pods.
	EventSink interface {
		Event(pod api.Pod, eventType, reason, message string)
	}
)

// Event types and the reasons of the events the lifecycle posts (framework
// exports them).
const (
	EventTypeNormal  = "Normal"
	EventTypeWarning = "Warning"

	ReasonRefreshFailed    = "RefreshFailed"
	ReasonOrphanRemoved    = "OrphanRemoved"
	ReasonProvisioningSlow = "ProvisioningSlow"
)
