package framework

import (
	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// AttributeDeclarer is implemented by backends that accept volume attributes:
// Attributes declares them, as Options.Volumes.AcceptedAttributes declares the driver's
// (api.Attributes; api.ModeAttr, api.UIDAttr and api.GIDAttr for a root
// directory's mode and owner). The framework applies the declaration before
// the backend's Validate (api.Attributes.Apply): a key neither the backend,
// the driver nor the framework declares is refused with the list of every
// accepted key, the declared ones are parsed (every problem reported at once)
// into Volume.Values and taken out of Volume.Params. Validate is left with the
// checks that need more than one attribute or the size. The declaration is
// applied once: Validate, Create and every later call (Delete, Find, Check,
// Content, also for a volume rebuilt from its record) get a volume whose
// Values hold it, and read them there; a backend never applies its own
// declaration again. A caller outside the framework applies it with
// ValidateVolume (the plugin server does, and before Create). The declaration must
// pass api.Attributes.Check and may not repeat a key of Options.Volumes.AcceptedAttributes.
type AttributeDeclarer interface {
	Attributes() api.Attributes
}

// ValidateVolume checks v as NodePublishVolume does for backend b, after the
// framework took its own attributes and the driver's out of v.Params: it
// applies the attributes b declares (AttributeDeclarer; values into v.Values),
// then runs b's Validator; a backend with neither accepts no attribute and no
// fsType. The plugin server and framework/backendtest check volumes with it,
// so that a backend is held to one set of rules wherever it runs.
func ValidateVolume(b Backend, v *api.Volume) error {
	if ad, ok := As[AttributeDeclarer](b); ok {
		if err := ad.Attributes().Apply(v); err != nil {
			return err
		}
	}
	if val, ok := As[Validator](b); ok {
		return val.Validate(v)
	}
	return volume.CheckWithoutValidator(v)
}
