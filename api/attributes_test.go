package api_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

var testAttrs = api.Attributes{
	api.DNSLabelAttr("app").Required(),
	api.EnumAttr("format", "json", "yaml").Default("json"),
	api.PatternAttr("version", `v[0-9]+`),
	api.QuantityAttr("cache", 1<<20, 64<<20).Default("4Mi"),
	api.IntAttr("replicas", 1, 5),
	api.BoolAttr("debug"),
	api.StringAttr("note"),
}

func TestAttributesParse(t *testing.T) {
	if err := testAttrs.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	vals, err := testAttrs.Parse(api.Params{"app": "web-1", "version": "v2", "replicas": "3", "debug": "true", "other": "left alone"})
	if err != nil {
		t.Fatal(err)
	}
	if vals.String("app") != "web-1" || !vals["app"].Set {
		t.Errorf("app = %+v", vals["app"])
	}
	if vals.String("format") != "json" || vals["format"].Set {
		t.Errorf("format = %+v, want the default, not set", vals["format"])
	}
	if vals.Int("cache") != 4<<20 {
		t.Errorf("cache = %d, want the default 4Mi in bytes", vals.Int("cache"))
	}
	if vals.Int("replicas") != 3 || !vals.Bool("debug") || vals.String("version") != "v2" {
		t.Errorf("values %+v", vals)
	}
	if vals.Has("note") || vals.Has("other") {
		t.Errorf("unset attribute without default, or an undeclared key, has a value: %+v", vals)
	}
	if got := testAttrs.Split(api.Params{"app": "x", "other": "y"}); len(got) != 1 || got["other"] != "y" {
		t.Errorf("Split = %v, want the undeclared key only", got)
	}
}

func TestAttributesRefusals(t *testing.T) {
	for _, tc := range []struct {
		params api.Params
		want   string
	}{
		{api.Params{}, `attribute "app" is required`},
		{api.Params{"app": "Web"}, `attribute "app": "Web" is not a DNS label`},
		{api.Params{"app": strings.Repeat("a", 64)}, `is not a DNS label`},
		{api.Params{"app": "a", "format": "xml"}, `attribute "format": "xml" is not one of "json", "yaml"`},
		{api.Params{"app": "a", "version": "2"}, `attribute "version": "2" does not match v[0-9]+`},
		{api.Params{"app": "a", "cache": "128Mi"}, `attribute "cache": 128Mi is outside 1Mi to 64Mi`},
		{api.Params{"app": "a", "cache": "lots"}, `attribute "cache": "lots" is not a quantity`},
		{api.Params{"app": "a", "replicas": "9"}, `attribute "replicas": "9" is not an integer between 1 and 5`},
		{api.Params{"app": "a", "debug": "yes"}, `attribute "debug": "yes" must be "true" or "false"`},
	} {
		_, err := testAttrs.Parse(tc.params)
		if !errors.Is(err, api.ErrInvalidParams) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%v) = %v, want ErrInvalidParams containing %q", tc.params, err, tc.want)
		}
	}
	// Every problem at once, each named.
	_, err := testAttrs.Parse(api.Params{"format": "xml", "replicas": "0"})
	for _, want := range []string{`"app" is required`, `"format"`, `"replicas"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse with three problems = %v, want it to name %s", err, want)
		}
	}
}

func TestAttributesCheck(t *testing.T) {
	for _, tc := range []struct {
		attrs api.Attributes
		want  string
	}{
		{api.Attributes{api.StringAttr("a"), api.BoolAttr("a")}, `"a" is declared twice`},
		{api.Attributes{api.StringAttr("size")}, `"size" is the framework's own`},
		{api.Attributes{api.StringAttr("backend")}, `"backend" is the framework's own`},
		{api.Attributes{api.StringAttr("csi.storage.k8s.io/pod.name")}, `reserved prefix`},
		{api.Attributes{api.StringAttr("")}, `empty key`},
		{api.Attributes{api.StringAttr("a").Required().Default("x")}, `required and has a default`},
		{api.Attributes{api.EnumAttr("f", "a").Default("b")}, `attribute "f": default:`},
		{api.Attributes{api.IntAttr("n", 5, 1)}, `minimum 5 is more than maximum 1`},
		{api.Attributes{api.EnumAttr("e")}, `no allowed value`},
	} {
		if err := tc.attrs.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%v) = %v, want %q", tc.attrs.Keys(), err, tc.want)
		}
	}
}

func TestUnknownAttributesError(t *testing.T) {
	err := api.Params{"b": "1", "a": "2", "ok": "3"}.Only("ok", "mode")
	var ue *api.UnknownAttributesError
	if !errors.As(err, &ue) || !errors.Is(err, api.ErrInvalidParams) {
		t.Fatalf("Only = %#v, want an *UnknownAttributesError wrapping ErrInvalidParams", err)
	}
	const want = `invalid volume attributes: unknown attribute(s) "a", "b"; this driver accepts "mode", "ok"`
	if err.Error() != want {
		t.Errorf("message %q, want %q", err.Error(), want)
	}
}
