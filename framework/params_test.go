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
	if m, err := p.FileMode("mode", 0); err != nil || m.Perm() != 0o777 || m&fs.ModeSticky == 0 {
		t.Errorf("FileMode = %v %v", m, err)
	}
	if _, err := p.Bool("b", false); err == nil {
		t.Error(`"yes" accepted as bool`)
	}
	if n, err := p.Int("n", 0, 0, 5); err == nil {
		t.Errorf("7 accepted in [0,5]: %d", n)
	}
	if err := p.Only("size", "mode", "n", "b"); err == nil || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("Only = %v", err)
	}
	secrets := api.Secrets{"k": "value"}
	if s := fmt.Sprintf("%v %s %#v %+v", secrets, secrets, secrets, secrets); strings.Contains(s, "value") {
		t.Errorf("Secrets leak: %s", s)
	}
}
