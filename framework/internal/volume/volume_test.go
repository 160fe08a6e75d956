package volume

import (
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
		{"windows long UNC prefix", `C:\var\lib\kubelet`, `\\?\UNC\server\share\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not under"},
		{"windows device path", `C:\var\lib\kubelet`, `\\.\C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount`, true, "", "not under"},
		{"windows traversal with forward slashes", `C:\var\lib\kubelet`, `C:/var/lib/kubelet/pods/` + uid + `/../../x/volumes/kubernetes.io~csi/data/mount`, true, "", "'..'"},
		{"windows wrong plugin", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~secret\data\mount`, true, "", "does not have the form"},
		{"windows extra component", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\data\mount\x`, true, "", "does not have the form"},
		{"windows upper-case volume name", `C:\var\lib\kubelet`, `C:\var\lib\kubelet\pods\` + uid + `\volumes\kubernetes.io~csi\Data\mount`, true, "", "volume name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTarget(tc.root, tc.p, tc.windows)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.VolumeName != tc.wantName || !strings.EqualFold(got.PodUID, uid) && !strings.HasPrefix(tc.p, "/var/lib/kubelet/pods/8f2e") {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

func TestCheckVolumeID(t *testing.T) {
	tg := Target{PodUID: uid, VolumeName: "data"}
	if err := tg.CheckHandle(api.VolumeHandle(uid, "data")); err != nil {
		t.Fatal(err)
	}
	if err := tg.CheckHandle(api.VolumeHandle(uid, "other")); err == nil {
		t.Fatal("handle of another volume accepted")
	}
	if err := tg.CheckHandle("csi-" + strings.Repeat("0", 64)); err == nil {
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
			got, err := ParseTarget(root, p, windows)
			if err != nil {
				continue
			}
			n := normalize(p, windows)
			if strings.Contains("/"+n+"/", "/../") {
				t.Fatalf("accepted %q with '..'", p)
			}
			if !ValidUID(got.PodUID) || !validVolumeName(got.VolumeName) {
				t.Fatalf("accepted %q with invalid parts %+v", p, got)
			}
			want := strings.ToLower(normalize(root, windows)) + "/pods/" + strings.ToLower(got.PodUID) + "/volumes/kubernetes.io~csi/" + got.VolumeName + "/mount"
			if windows {
				if !strings.EqualFold(strings.TrimSuffix(cleanSlash(n), "/"), want) {
					t.Fatalf("accepted %q, normalized %q, want %q", p, n, want)
				}
			} else if cleanSlash(n) != normalize(root, false)+"/pods/"+got.PodUID+"/volumes/kubernetes.io~csi/"+got.VolumeName+"/mount" {
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
