package framework

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

const uid = "0b7a4c2e-1f2d-4e5a-9c3b-7d8e9f0a1b2c"

func TestParseTargetPath(t *testing.T) {
	tests := []struct {
		name     string
		root, p  string
		windows  bool
		wantName string
		wantErr  string
	}{
		{"linux ok", "/var/lib/kubelet", "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount", false, "data", ""},
		{"linux root with trailing slash", "/var/lib/kubelet/", "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount", false, "data", ""},
		{"linux double slash cleaned", "/var/lib/kubelet", "/var/lib/kubelet//pods/" + uid + "/volumes/kubernetes.io~csi/data/mount", false, "data", ""},
		{"linux trailing slash", "/var/lib/kubelet", "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount/", false, "data", ""},
		{"linux dot dot", "/var/lib/kubelet", "/var/lib/kubelet/pods/" + uid + "/../x/volumes/kubernetes.io~csi/data/mount", false, "", "'..'"},
		{"linux relative", "/var/lib/kubelet", "var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount", false, "", "absolute"},
		{"linux sibling root", "/var/lib/kubelet", "/var/lib/kubelet2/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount", false, "", "not under"},
		{"linux backslashes are not separators", "/var/lib/kubelet", `/var/lib/kubelet/pods/` + uid + `\volumes\kubernetes.io~csi\data\mount`, false, "", "does not have the form"},
		{"linux case matters", "/var/lib/kubelet", "/VAR/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount", false, "", "not under"},
		{"linux root is /", "/", "/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount", false, "data", ""},
		{"linux empty", "/var/lib/kubelet", "", false, "", "required"},
		{"linux wrong plugin", "/var/lib/kubelet", "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~secret/data/mount", false, "", "does not have the form"},
		{"linux uppercase volume name", "/var/lib/kubelet", "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/Data/mount", false, "", "volume name"},
		{"linux long volume name", "/var/lib/kubelet", "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/" + strings.Repeat("a", 64) + "/mount", false, "", "volume name"},
		{"linux volume name with dash", "/var/lib/kubelet", "/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/my-vol-1/mount", false, "my-vol-1", ""},
		{"linux static pod uid", "/var/lib/kubelet", "/var/lib/kubelet/pods/8f2ed0cbd9e1b4e4a1b9b2c1d0e0f0a1/volumes/kubernetes.io~csi/v/mount", false, "v", ""},
		{"windows backslashes", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows forward slashes", `C:\var\lib\kubelet`, `C:/var/lib/kubelet/pods/` + uid + `/volumes/kubernetes.io~csi/data/mount`, true, "data", ""},
		{"windows mixed separators", `c:/var/lib/kubelet`, `C:\var\lib\kubelet/pods\` + uid + `/volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows drive letter case", `c:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows path case", `C:\var\lib\kubelet`, `C:\Var\Lib\Kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows drive-less path", `C:\var\lib\kubelet`, `\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows long path prefix", `C:\var\lib\kubelet`, `\\?\C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows other drive", `C:\var\lib\kubelet`, `D:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not under"},
		{"windows traversal", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\..\..\x\volumes\kubernetes.io~csi\data\mount`, true, "", "'..'"},
		{"windows relative", `C:\var\lib\kubelet`, `var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "absolute"},
		{"windows drive-relative", `C:\var\lib\kubelet`, `C:var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "absolute"},
		{"windows UNC", `C:\var\lib\kubelet`, `\\server\share\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not under"},
		{"windows sibling root", `C:\var\lib\kubelet`, `C:\var\lib\kubelet2\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not under"},
		{"windows long path prefix lower-case drive", `C:\var\lib\kubelet`, `\\?\c:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows root with trailing backslash", `C:\var\lib\kubelet\`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows drive-less root", `\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows root in forward slashes", `C:/var/lib/kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows doubled separators", `C:\var\lib\kubelet`, `C:\\var\\lib\kubelet\\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows trailing backslash", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount\`, true, "data", ""},
		{"windows upper-case pod UID", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + strings.ToUpper(uid) + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not a pod UID"},
		{"windows other drive root", `D:\k`, `d:\k\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "data", ""},
		{"windows drive-less path, root on D", `D:\k`, `\k\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not under"},
		{"windows long UNC prefix", `C:\var\lib\kubelet`, `\\?\UNC\server\share\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "absolute"},
		{"windows device path", `C:\var\lib\kubelet`, `\\.\C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not under"},
		{"windows traversal with forward slashes", `C:\var\lib\kubelet`, `C:/var/lib/kubelet/pods/` + uid + `/../../x/volumes/kubernetes.io~csi/data/mount`, true, "", "'..'"},
		{"windows wrong plugin", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~secret\data\mount`, true, "", "does not have the form"},
		{"windows extra component", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount\x`, true, "", "does not have the form"},
		{"windows upper-case volume name", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\Data\mount`, true, "", "volume name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTargetPath(tc.root, tc.p, tc.windows)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.volumeName != tc.wantName || !strings.EqualFold(got.podUID, uid) && !strings.HasPrefix(tc.p, "/var/lib/kubelet/pods/8f2e") {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

func TestCheckVolumeID(t *testing.T) {
	tg := target{podUID: uid, volumeName: "data"}
	if err := checkVolumeID(api.VolumeHandle(uid, "data"), tg); err != nil {
		t.Fatal(err)
	}
	if err := checkVolumeID(api.VolumeHandle(uid, "other"), tg); err == nil {
		t.Fatal("handle of another volume accepted")
	}
	if err := checkVolumeID("csi-"+strings.Repeat("0", 64), tg); err == nil {
		t.Fatal("wrong handle accepted")
	}
}

// FuzzParseTargetPath checks that whatever the input, an accepted path is under
// the root, free of "..", and round-trips to the same pod and volume.
func FuzzParseTargetPath(f *testing.F) {
	f.Add("/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount")
	f.Add("/var/lib/kubelet/pods/../../etc/volumes/kubernetes.io~csi/data/mount")
	f.Add("/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/../mount")
	f.Add(`C:\var\lib\kubelet\pods\x\volumes\kubernetes.io~csi\d\mount`)
	f.Fuzz(func(t *testing.T, p string) {
		for _, windows := range []bool{false, true} {
			root := "/var/lib/kubelet"
			if windows {
				root = `C:\var\lib\kubelet`
			}
			got, err := parseTargetPath(root, p, windows)
			if err != nil {
				continue
			}
			n := normalizePath(p, windows)
			if hasDotDot(n) {
				t.Fatalf("accepted %q with '..'", p)
			}
			if !validUID(got.podUID) || !validVolumeName(got.volumeName) {
				t.Fatalf("accepted %q with invalid parts %+v", p, got)
			}
			want := strings.ToLower(normalizePath(root, windows)) + "/pods/" + strings.ToLower(got.podUID) + "/volumes/kubernetes.io~csi/" + got.volumeName + "/mount"
			if windows {
				if !strings.EqualFold(strings.TrimSuffix(cleanSlash(n), "/"), want) {
					t.Fatalf("accepted %q, normalized %q, want %q", p, n, want)
				}
			} else if cleanSlash(n) != normalizePath(root, false)+"/pods/"+got.podUID+"/volumes/kubernetes.io~csi/"+got.volumeName+"/mount" {
				t.Fatalf("accepted %q outside the expected layout", p)
			}
		}
	})
}

func cleanSlash(p string) string {
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	return strings.TrimSuffix(strings.ReplaceAll(p, "/./", "/"), "/")
}

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
