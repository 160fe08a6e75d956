package framework

import (
	"errors"
	"maps"
	"slices"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
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

// parser reads the CSI requests by o (csiserver.Parser).
func (d *Driver) parser() *csiserver.Parser {
	o := &d.opts
	return &csiserver.Parser{
		DriverName:     o.DriverName,
		KubeletRootDir: o.Node.KubeletRootDir,
		Windows:        isWindows,
		Own:            csiserver.OwnAttributes(backendNames(o.Backends), o.Volumes.DefaultBackend),
		Declared:       o.Volumes.AcceptedAttributes,
		MaxVolumeSize:  o.Limits.MaxVolumeSize,
		Validate: func(backend string, v *api.Volume) error {
			return d.allAccepted(ValidateVolume(o.Backends[backend], v))
		},
	}
}

// allAccepted completes a backend's refusal of unknown attributes with every
// key the pod may set: the backend's, the driver's declared ones and the
// framework's. Other errors pass through.
func (d *Driver) allAccepted(err error) error {
	var ue *api.UnknownAttributesError
	if err == nil {
		return nil
	}
	if !errors.As(err, &ue) {
		return err
	}
	accepted := slices.Concat(ue.Accepted, d.opts.Volumes.AcceptedAttributes.Keys(), volume.FrameworkParams)
	slices.Sort(accepted)
	return &api.UnknownAttributesError{Unknown: ue.Unknown, Accepted: slices.Compact(accepted)}
}

// fromRecord is the backend's and content provider's view of a persisted
// volume (volume.FromRecord), with the driver's declared attributes parsed
// again from the record's and taken out of Params. Should the declaration have
// changed since the publish so that they no longer parse, Attributes hold what
// still does.
func (d *Driver) fromRecord(rec *store.Record) *api.Volume {
	v := volume.FromRecord(rec)
	attrs := declared(d.opts.Volumes.AcceptedAttributes, d.opts.Backends[rec.Backend])
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
