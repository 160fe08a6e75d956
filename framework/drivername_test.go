package framework_test

import (
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/framework"
)

// TestNewRefusesDriverNameTheAPIServerRefuses: New takes only the names a
// CSIDriver object can have (api.ValidateDriverName), and its error says what
// is wrong and what would be accepted.
func TestNewRefusesDriverNameTheAPIServerRefuses(t *testing.T) {
	opts := func(name string) framework.Options {
		return framework.Options{DriverName: name, Backends: map[string]framework.Backend{"x": framework.BackendFuncs{}}, Node: framework.NodeOptions{ID: "n"}}
	}
	name63 := strings.Repeat("a", 31) + "." + strings.Repeat("b", 31)
	for _, name := range []string{"motd.example.com", "a", "a-b.c", name63} {
		if _, err := framework.New(opts(name)); err != nil {
			t.Errorf("New(DriverName %q): %v", name, err)
		}
	}
	for name, want := range map[string][]string{
		"Motd_Driver":            {`DriverName "Motd_Driver" is not a valid CSI driver name`, "upper-case letters (M D)", `'_'`, "DNS-1123 subdomain", `"motd-driver" would be accepted`},
		name63 + "b":             {"it is 64 characters long", "at most 63 characters"},
		"-motd.example.com":      {"starts or ends with '-'", `"motd.example.com" would be accepted`},
		"motd..example.com":      {"empty label"},
		"motd.example.com/token": {`'/'`},
	} {
		_, err := framework.New(opts(name))
		if err == nil {
			t.Errorf("New(DriverName %q) accepted it", name)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New(DriverName %q) = %v, want it to say %s", name, err, w)
			}
		}
	}
}
