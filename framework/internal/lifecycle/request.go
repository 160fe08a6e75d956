package lifecycle

import (
	"context"
	"maps"
	"slices"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// publishRequest is a read and checked NodePublishVolumeRequest
// (csiserver.Publish) with its backend.
type publishRequest struct {
	vol     *api.Volume
	backend Backend
	// params are all user attributes, including the framework's own; they are
	// persisted and hashed.
	params api.Params
	hash   string
}

// Publish is NodePublishVolume of a read and checked request (csiserver.Publish):
// v, with params, all user attributes, and their hash.
func (d *Engine) Publish(ctx context.Context, v *api.Volume, params api.Params, hash string) error {
	return d.nodePublishVolume(ctx, &publishRequest{vol: v, backend: d.cfg.Backends[v.Backend], params: params, hash: hash})
}

// fromRecord is the backend's and content provider's view of a persisted
// volume (volume.FromRecord), with the driver's declared attributes parsed
// again from the record's and taken out of Params. Should the declaration have
// changed since the publish so that they no longer parse, Attributes hold what
// still does.
func (d *Engine) fromRecord(rec *store.Record) *api.Volume {
	v := volume.FromRecord(rec)
	attrs := d.declared(rec.Backend)
	if len(attrs) == 0 {
		return v
	}
	v.Values = make(api.Values, len(attrs))
	for _, a := range attrs {
		if vals, err := (api.Attributes{a}).Parse(v.Params); err == nil {
			maps.Copy(v.Values, vals)
		}
	}
	v.Params = attrs.Split(v.Params)
	return v
}

// declared are the attributes of backend's volumes the driver and the backend
// declare.
func (d *Engine) declared(backend string) api.Attributes {
	if b, ok := d.cfg.Backends[backend]; ok {
		return slices.Concat(d.cfg.Volumes.AcceptedAttributes, b.Attributes())
	}
	return d.cfg.Volumes.AcceptedAttributes
}

// authorizers returns what approves a first publish of a volume of the named
// backend: Options.Authorizer, then the backend itself when it is an
// Authorizer. Each must approve.
func (d *Engine) authorizers(backend string) []Authorizer {
	var as []Authorizer
	if d.cfg.Volumes.Authorizer != nil {
		as = append(as, d.cfg.Volumes.Authorizer)
	}
	if b, ok := d.cfg.Backends[backend]; ok {
		if a := b.Authorizer(); a != nil {
			as = append(as, a)
		}
	}
	return as
}

// sameTarget reports whether two target paths name the same target.
func (d *Engine) sameTarget(a, b string) bool { return volume.SameTarget(a, b, d.cfg.Windows) }
