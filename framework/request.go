package framework

import (
	"errors"
	"slices"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

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
			return o.allAccepted(ValidateVolume(o.Backends[backend], v))
		},
	}
}

// allAccepted completes a backend's refusal of unknown attributes with every
// key the pod may set: the backend's, the driver's declared ones and the
// framework's. Other errors pass through.
func (o *Options) allAccepted(err error) error {
	var ue *api.UnknownAttributesError
	if err == nil {
		return nil
	}
	if !errors.As(err, &ue) {
		return err
	}
	accepted := slices.Concat(ue.Accepted, o.Volumes.AcceptedAttributes.Keys(), volume.FrameworkParams)
	slices.Sort(accepted)
	return &api.UnknownAttributesError{Unknown: ue.Unknown, Accepted: slices.Compact(accepted)}
}
