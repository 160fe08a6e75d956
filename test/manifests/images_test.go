package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var digestRef = regexp.MustCompile(`^[^@]+@sha256:[a-f0-9]{64}$`)

// pinned reports why an image reference is not pinned ("" when it is): a
// digest, or a tag other than latest.
func pinned(ref string) string {
	if digestRef.MatchString(ref) {
		return ""
	}
	if strings.Contains(ref, "@") {
		return "malformed digest"
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	i := strings.LastIndex(last, ":")
	if i < 0 {
		return "no tag or digest (means :latest)"
	}
	if tag := last[i+1:]; tag == "" || strings.HasPrefix(tag, "latest") {
		return "tag " + tag + " moves"
	}
	return ""
}

func TestPinned(t *testing.T) {
	for ref, want := range map[string]bool{
		"ghcr.io/a/b:v0.1.0": true, "ghcr.io/a/b@sha256:" + strings.Repeat("ab", 32): true,
		"localhost:5000/a/b:v1": true, "ghcr.io/a/b": false, "localhost:5000/a/b": false,
		"ghcr.io/a/b:latest": false, "ghcr.io/a/b:latest-windows-hostprocess": false, "ghcr.io/a/b@sha256:abc": false,
	} {
		if got := pinned(ref) == ""; got != want {
			t.Errorf("pinned(%q) = %v, want %v", ref, got, want)
		}
	}
}

// TestImagesPinned: no rendered target runs :latest or an untagged image, whose
// IfNotPresent pull would keep a node on whatever it pulled first.
func TestImagesPinned(t *testing.T) {
	n := 0
	for _, r := range renderAll(t) {
		for _, o := range r.objs {
			for _, c := range containers(o) {
				n++
				ref, _ := c.Get("image").(string)
				if why := pinned(ref); why != "" {
					t.Errorf("%s: %s %s container %s: image %q not pinned: %s", r.Name, o.Kind(), o.Name(), c.Name2(), ref, why)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no containers rendered")
	}
}

// TestImageVersionsAgree: the kustomize overlays run the version the chart's
// appVersion names (one version to bump).
func TestImageVersionsAgree(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, Chart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"kustomize-linux":                    driverImage + ":" + chart.AppVersion,
		"kustomize-linux-embedded-registrar": driverImage + ":" + chart.AppVersion,
		"kustomize-windows-hostprocess":      driverImage + ":" + chart.AppVersion,
		"kustomize-windows-csi-proxy":        driverImage + ":" + chart.AppVersion + "-windows-csi-proxy-ltsc2022",
		"helm-default":                       driverImage + ":" + chart.AppVersion,
		"helm-windows-hostprocess":           driverImage + ":" + chart.AppVersion,
		"helm-windows-csi-proxy":             driverImage + ":" + chart.AppVersion + "-windows-csi-proxy-ltsc2022",
	}
	for _, r := range renderAll(t) {
		w, ok := want[r.Name]
		if !ok {
			continue
		}
		if got := driverContainer(t, r).Get("image"); got != w {
			t.Errorf("%s: driver image %v, want %s", r.Name, got, w)
		}
	}
}

const driverImage = PlaceholderImage

func driverContainer(t *testing.T, r rendered) Object {
	t.Helper()
	for _, ds := range r.find("DaemonSet") {
		for _, c := range containers(ds) {
			if c.Name2() == "driver" {
				return c
			}
		}
	}
	t.Fatalf("%s: no driver container", r.Name)
	return nil
}

// TestImageDigest: a digest renders repository:tag@sha256:... in Helm with a tag
// set (the release's manifests' form; the digest is what runs), repository@sha256:...
// without one, and through kustomize's images transformer; a malformed digest is
// refused.
func TestImageDigest(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("0123456789abcdef", 4)
	b, err := Helm(filepath.Join(root, Chart), map[string]any{
		"image":     map[string]any{"repository": "registry.example.com/scratch", "tag": "v9", "digest": digest},
		"registrar": map[string]any{"image": map[string]any{"digest": digest}},
		"windows":   map[string]any{"enabled": true},
	}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	// The index make image builds carries the Windows HostProcess variant: the
	// Windows DaemonSet runs the same digest as the Linux one.
	if n := strings.Count(s, `image: "registry.example.com/scratch:v9@`+digest+`"`); n != 2 {
		t.Errorf("helm with image.tag, image.digest and windows.enabled: the digest is the driver image of %d DaemonSets, want 2 (Linux and Windows)", n)
	}
	if want := `image: "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.16.0@` + digest + `"`; !strings.Contains(s, want) {
		t.Errorf("helm with registrar.image.digest: no %s", want)
	}
	// Without a tag: repository@digest, not the appVersion's tag.
	b, err = Helm(filepath.Join(root, Chart), map[string]any{
		"image":   map[string]any{"repository": "registry.example.com/scratch", "digest": digest},
		"windows": map[string]any{"enabled": true},
	}, Namespace)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `image: "registry.example.com/scratch@`+digest+`"`); n != 2 {
		t.Errorf("helm with image.digest only and windows.enabled: the digest is the driver image of %d DaemonSets, want 2 (Linux and Windows)", n)
	}
	for name, img := range map[string]map[string]any{
		"short digest":     {"digest": "sha256:abc"},
		"upper-case hex":   {"digest": "sha256:" + strings.Repeat("AB", 32)},
		"no algorithm":     {"digest": strings.Repeat("ab", 32)},
		"latest tag":       {"tag": "latest"},
		"empty repository": {"repository": ""},
	} {
		if _, err := Helm(filepath.Join(root, Chart), map[string]any{"image": img}, Namespace); err == nil {
			t.Errorf("image %s: rendered, want a schema error", name)
		}
	}

	// kustomize: an operator's overlay on top of ours pins the digest.
	for _, overlay := range []string{"deploy/overlays/linux", "deploy/overlays/windows-hostprocess", "deploy/overlays/windows-csi-proxy"} {
		dir := t.TempDir()
		rel, err := filepath.Rel(dir, filepath.Join(root, overlay)) // kustomize refuses absolute paths
		if err != nil {
			t.Fatal(err)
		}
		k := "resources:\n- " + rel + "\nimages:\n- name: " + driverImage +
			"\n  newName: registry.example.com/scratch\n  digest: " + digest + "\n"
		objs := kustomizeText(t, dir, k)
		got := driverContainer(t, rendered{Target{Name: overlay}, objs}).Get("image")
		if got != "registry.example.com/scratch@"+digest {
			t.Errorf("%s with images.digest: driver image %v, want registry.example.com/scratch@%s", overlay, got, digest)
		}
	}
}
