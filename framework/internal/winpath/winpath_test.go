package winpath

import "testing"

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		`C:\var\lib\kubelet`:               `c:\var\lib\kubelet`,
		`C:/var/lib/kubelet/`:              `c:\var\lib\kubelet`,
		`\var\lib\kubelet`:                 `c:\var\lib\kubelet`,
		`/var/lib/kubelet`:                 `c:\var\lib\kubelet`,
		`c:\var\\lib\kubelet\\`:            `c:\var\lib\kubelet`,
		`\\?\C:\var\lib\kubelet`:           `c:\var\lib\kubelet`,
		`\??\C:\var\lib\kubelet`:           `c:\var\lib\kubelet`,
		`\\?\UNC\server\share\dir`:         `\\server\share\dir`,
		`\\server\share\dir\`:              `\\server\share\dir`,
		`C:\`:                              `c:\`,
		`C:\Var\Lib\Kubelet\pods\UID\..\x`: `c:\Var\Lib\Kubelet\pods\UID\..\x`,
		`C:var\lib`:                        `c:var\lib`,
		`relative\dir`:                     `relative\dir`,
	} {
		if got := Clean(in); got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
	}
	if Key(`C:\Var\LIB`) != Key(`\\?\c:/var/lib/`) {
		t.Error("Key does not equate two spellings of one path")
	}
	if Slash(`C:\var\lib`) != "c:/var/lib" {
		t.Errorf("Slash = %q", Slash(`C:\var\lib`))
	}
}
