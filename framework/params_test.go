package framework

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

func TestParamsGetters(t *testing.T) {
	p := api.Params{"size": "64Mi", "mode": "1777", "n": "7", "b": "yes", "big": "100Ei"}
	if n, err := p.Quantity("size", 0); err != nil || n != 64<<20 {
		t.Errorf("Quantity = %d %v", n, err)
	}
	if _, err := p.Quantity("big", 0); err == nil {
		t.Error("100Ei accepted")
	}
	if vals, err := (api.Attributes{api.ModeAttr(0)}).Parse(p); err != nil || vals.Mode("mode").Perm() != 0o777 || vals.Mode("mode")&fs.ModeSticky == 0 {
		t.Errorf("ModeAttr = %v %v", vals, err)
	}
	if _, err := (api.Attributes{api.BoolAttr("b")}).Parse(p); err == nil {
		t.Error(`"yes" accepted as bool`)
	}
	if vals, err := (api.Attributes{api.IntAttr("n", 0, 5)}).Parse(p); err == nil {
		t.Errorf("7 accepted in [0,5]: %v", vals)
	}
	if err := p.Only("size", "mode", "n", "b"); err == nil || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("Only = %v", err)
	}
	secrets := api.Secrets{"k": "value"}
	if s := fmt.Sprintf("%v %s %#v %+v", secrets, secrets, secrets, secrets); strings.Contains(s, "value") {
		t.Errorf("Secrets leak: %s", s)
	}
}
