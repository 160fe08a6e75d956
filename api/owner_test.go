package api_test

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

// The root directory's attributes, declared once for every backend, parse and
// refuse as the backends' own getters did.
func TestOwnerAttributes(t *testing.T) {
	attrs := api.Attributes{api.ModeAttr(0o777 | fs.ModeSticky), api.UIDAttr().Default("0"), api.GIDAttr()}
	if err := attrs.Check(); err != nil {
		t.Fatal(err)
	}
	vals, err := attrs.Parse(api.Params{})
	if err != nil {
		t.Fatal(err)
	}
	if m := vals.Mode(api.ParamMode); m != 0o777|fs.ModeSticky || vals[api.ParamMode].Set || vals.String(api.ParamMode) != "1777" {
		t.Errorf("default mode = %v (%+v), want 01777, not set by the pod", m, vals[api.ParamMode])
	}
	if !vals.Has(api.ParamUID) || vals.Int(api.ParamUID) != 0 || vals.Has(api.ParamGID) {
		t.Errorf("uid/gid = %+v: want the uid default 0 and no gid", vals)
	}
	vals, err = attrs.Parse(api.Params{"mode": "2750", "uid": "1000", "gid": "4294967294"})
	if err != nil {
		t.Fatal(err)
	}
	if vals.Mode(api.ParamMode) != 0o750|fs.ModeSetgid || !vals[api.ParamMode].Set || vals.Int(api.ParamUID) != 1000 || vals.Int(api.ParamGID) != 4294967294 {
		t.Errorf("values %+v", vals)
	}
	if err := (api.Attributes{api.ModeAttr(0)}).Check(); err != nil {
		t.Errorf("ModeAttr(0) (no default) does not check")
	}
	if vals, _ := (api.Attributes{api.ModeAttr(0)}).Parse(nil); vals.Has(api.ParamMode) {
		t.Errorf("ModeAttr(0) has a default: %+v", vals)
	}
	for _, tc := range []struct {
		params api.Params
		want   string
	}{
		{api.Params{"mode": "rwx"}, `invalid volume attributes: attribute "mode": "rwx" is not an octal mode such as 0755`},
		{api.Params{"mode": "17777"}, `attribute "mode": "17777" is not an octal mode such as 0755`},
		{api.Params{"uid": "-1"}, `attribute "uid": "-1" is not an integer between 0 and 4294967294`},
		{api.Params{"gid": "4294967295"}, `attribute "gid": "4294967295" is not an integer between 0 and 4294967294`},
		{api.Params{"uid": "x", "gid": "y"}, `attribute "uid": "x" is not an integer between 0 and 4294967294; attribute "gid": "y" is not`},
	} {
		_, err := attrs.Parse(tc.params)
		if !errors.Is(err, api.ErrInvalidParams) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%v) = %v, want ErrInvalidParams saying %q", tc.params, err, tc.want)
		}
	}
}

// Apply is what the framework does with a backend's declaration: undeclared
// keys refused, declared ones parsed into Values and out of Params; applying
// again (a backend's own Validate after the framework's) changes nothing.
func TestAttributesApply(t *testing.T) {
	attrs := api.Attributes{api.ModeAttr(0o777), api.UIDAttr(), api.StringAttr("nr_inodes")}
	v := &api.Volume{Params: api.Params{"mode": "0700", "nr_inodes": "5"}, Values: api.Values{"app": {Raw: "web", Set: true}}}
	if err := attrs.Apply(v); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if len(v.Params) != 0 || v.Values.Mode("mode") != 0o700 || !v.Values["mode"].Set || v.Values.String("nr_inodes") != "5" ||
			v.Values.Has("uid") || v.Values.String("app") != "web" {
			t.Errorf("%s: Params %v, Values %+v", when, v.Params, v.Values)
		}
	}
	check("applied")
	if err := attrs.Apply(v); err != nil {
		t.Fatal(err)
	}
	check("applied twice")

	v = &api.Volume{Params: api.Params{"mode": "0700", "colour": "blue"}}
	err := attrs.Apply(v)
	var ue *api.UnknownAttributesError
	if !errors.As(err, &ue) || !errors.Is(err, api.ErrInvalidParams) || strings.Join(ue.Unknown, ",") != "colour" ||
		strings.Join(ue.Accepted, ",") != "mode,nr_inodes,uid" {
		t.Errorf("Apply with an undeclared key = %v, want an UnknownAttributesError naming it and the declared keys", err)
	}
	if v.Values != nil || v.Params["mode"] != "0700" {
		t.Errorf("a refused Apply changed the volume: Params %v, Values %v", v.Params, v.Values)
	}
	v = &api.Volume{}
	if err := attrs.Apply(v); err != nil || v.Values.Mode("mode") != 0o777 || v.Values["mode"].Set {
		t.Errorf("Apply of nothing = %v, Values %+v: want the default mode", err, v.Values)
	}
}
