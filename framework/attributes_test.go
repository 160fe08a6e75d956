package framework_test

import (
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
)

// A driver attribute with a backend's key would take it from the backend;
// New refuses it, and a backend declaration that cannot work, naming both.
func TestNewRefusesDeclarationConflicts(t *testing.T) {
	mem, err := tmpfs.New(tmpfs.Options{DefaultSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	_, err = framework.New(framework.Options{
		DriverName: "conflict.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"tmpfs": mem},
		Volumes:    framework.VolumeOptions{AcceptedAttributes: api.Attributes{api.StringAttr("app"), api.EnumAttr(api.ParamMode, "ro", "rw")}},
	})
	if err == nil || !strings.Contains(err.Error(), `attribute "mode" is backend "tmpfs"'s`) || strings.Contains(err.Error(), `"app"`) {
		t.Errorf("New with a driver attribute %q beside tmpfs = %v, want a refusal naming it and the backend", api.ParamMode, err)
	}

	broken := declaring{framework.BackendFuncs{}, api.Attributes{api.UIDAttr(), api.UIDAttr()}}
	_, err = framework.New(framework.Options{
		DriverName: "broken.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"b": broken},
	})
	if err == nil || !strings.Contains(err.Error(), `backend "b": Attributes: attribute "uid" is declared twice`) {
		t.Errorf("New with a backend declaring uid twice = %v, want a refusal naming the backend", err)
	}
}

// declaring is a backend that declares attrs and checks nothing else.
type declaring struct {
	framework.BackendFuncs
	attrs api.Attributes
}

func (d declaring) Attributes() api.Attributes { return d.attrs }
