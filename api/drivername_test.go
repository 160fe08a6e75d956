package api_test

import (
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

func TestValidateDriverName(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	name63 := strings.Repeat("a", 30) + "." + strings.Repeat("b", 32) // 63 characters
	for _, name := range []string{
		"hello.csi.ephemera.dev", "whoami.example.com", "a", "0", "a-b.c-d", "1.2.3",
		"x--y.example.com", label63, name63,
	} {
		if err := api.ValidateDriverName(name); err != nil {
			t.Errorf("ValidateDriverName(%q) = %v, want nil", name, err)
		}
	}
	for _, tc := range []struct {
		name    string
		want    []string // in the message
		suggest string   // the name the message offers, "" none
	}{
		{"", []string{"it is empty"}, ""},
		{"Motd_Driver", []string{`"Motd_Driver" is not a valid CSI driver name`, "upper-case letters (M D)", `'_'`, "DNS-1123 subdomain of at most 63 characters"}, "motd-driver"},
		{strings.Repeat("a", 64), []string{"it is 64 characters long"}, ""},
		{name63 + "c", []string{"it is 64 characters long"}, ""},
		{"-hello.example.com", []string{"starts or ends with '-'"}, "hello.example.com"},
		{"hello-.example.com", []string{"starts or ends with '-'"}, "hello.example.com"},
		{"hello..example.com", []string{"empty label"}, "hello.example.com"},
		{".hello", []string{"empty label"}, "hello"},
		{"hello.", []string{"empty label"}, "hello"},
		{"hello world", []string{`' '`}, "hello-world"},
		{"héllo.example.com", []string{`'é'`}, "h-llo.example.com"},
		{"csi/hello", []string{`'/'`}, "csi-hello"},
		{"___", []string{`'_'`}, ""},
	} {
		err := api.ValidateDriverName(tc.name)
		if err == nil {
			t.Errorf("ValidateDriverName(%q) = nil, want an error", tc.name)
			continue
		}
		msg := err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("ValidateDriverName(%q) = %q, want it to say %q", tc.name, msg, w)
			}
		}
		if tc.suggest != "" {
			if w := `"` + tc.suggest + `" would be accepted`; !strings.Contains(msg, w) {
				t.Errorf("ValidateDriverName(%q) = %q, want it to offer %q", tc.name, msg, tc.suggest)
			}
			if err := api.ValidateDriverName(tc.suggest); err != nil {
				t.Errorf("the suggestion %q is refused: %v", tc.suggest, err)
			}
		} else if strings.Contains(msg, "would be accepted") {
			t.Errorf("ValidateDriverName(%q) = %q, want no suggestion", tc.name, msg)
		}
	}
}
