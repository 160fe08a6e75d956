package manifests

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeLayout writes an OCI layout shaped like make image's (an index of three
// platform images and an SBOM artifact for each, in index.json under one tag) and
// its LAYOUT.sbom/ files, without building anything.
func fakeLayout(t *testing.T, version string) (layout, digest string) {
	t.Helper()
	layout = filepath.Join(t.TempDir(), "image")
	blobs := filepath.Join(layout, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(layout+".sbom", 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(mediaType string, b []byte) descriptor {
		sum := sha256.Sum256(b)
		d := descriptor{MediaType: mediaType, Digest: fmt.Sprintf("sha256:%x", sum), Size: int64(len(b))}
		if err := os.WriteFile(filepath.Join(blobs, fmt.Sprintf("%x", sum)), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	putJSON := func(mediaType string, v any) descriptor {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return put(mediaType, b)
	}
	var ms []any
	for _, p := range ImagePlatforms {
		goos, arch, _ := strings.Cut(p, "/")
		cfg := putJSON("application/vnd.oci.image.config.v1+json", map[string]any{"os": goos, "architecture": arch})
		layer := put("application/vnd.oci.image.layer.v1.tar+gzip", []byte("layer of "+p))
		img := putJSON(mediaTypeOCIManifest, map[string]any{"schemaVersion": 2, "mediaType": mediaTypeOCIManifest, "config": cfg, "layers": []any{layer}})
		ms = append(ms, map[string]any{"mediaType": img.MediaType, "digest": img.Digest, "size": img.Size, "platform": map[string]string{"os": goos, "architecture": arch}})
		bom := []byte(`{"bomFormat":"CycloneDX","specVersion":"1.6","metadata":{"component":{"name":"` + p + `"}}}`)
		if err := os.WriteFile(filepath.Join(layout+".sbom", strings.ReplaceAll(p, "/", "-")+".cdx.json"), bom, 0o644); err != nil {
			t.Fatal(err)
		}
		empty := put("application/vnd.oci.empty.v1+json", []byte("{}"))
		sb := putJSON(mediaTypeOCIManifest, map[string]any{"schemaVersion": 2, "mediaType": mediaTypeOCIManifest, "artifactType": sbomArtifactType,
			"config": empty, "layers": []any{put(sbomArtifactType, bom)}, "subject": img})
		ms = append(ms, map[string]any{"mediaType": sb.MediaType, "digest": sb.Digest, "size": sb.Size, "artifactType": sbomArtifactType,
			"platform": map[string]string{"os": "unknown", "architecture": "unknown"}})
	}
	idx := putJSON(mediaTypeOCIIndex, map[string]any{"schemaVersion": 2, "mediaType": mediaTypeOCIIndex, "manifests": ms})
	top, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaTypeOCIIndex, "manifests": []any{map[string]any{
		"mediaType": idx.MediaType, "digest": idx.Digest, "size": idx.Size, "annotations": map[string]string{"org.opencontainers.image.ref.name": version}}}})
	for name, b := range map[string][]byte{"index.json": top, "oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`)} {
		if err := os.WriteFile(filepath.Join(layout, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return layout, idx.Digest
}

// testRelease builds a release of HEAD from a fake layout and a fake plugin
// binary (this test binary: an ELF executable of the machine's platform).
func testRelease(t *testing.T) (*Release, Expect) {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rev, err := gitOutput(root, "rev-parse", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	layout, _ := fakeLayout(t, "v0.98.7")
	r := &Release{
		Version: "v0.98.7", Root: root, Revision: strings.TrimSpace(string(rev)), Epoch: time.Unix(1764547200, 0).UTC(),
		ImageLayout: layout, ImageRepo: "registry.example.com/ephemera/scratch", ReleaseURL: "https://example.com/releases/v0.98.7",
		Plugins: map[string]string{"linux/amd64": self}, Out: filepath.Join(t.TempDir(), "release"),
	}
	return r, Expect{Version: r.Version, ImageRepo: r.ImageRepo, ReleaseURL: r.ReleaseURL, Root: root, Revision: r.Revision, Epoch: r.Epoch,
		PluginPlatforms: []string{"linux/amd64"}}
}

// TestRelease builds a release from a fake image layout and checks it with
// CheckRelease (what make release runs on the real one); then breaks it in the
// ways CheckRelease must notice.
func TestRelease(t *testing.T) {
	t.Parallel()
	r, want := testRelease(t)
	digest, err := r.Build()
	if err != nil {
		t.Fatal(err)
	}
	a, err := CheckRelease(r.Out, want)
	if err != nil {
		t.Fatalf("CheckRelease: %v", err)
	}
	if a.Index != digest || a.Name != "registry.example.com/ephemera/scratch:v0.98.7" || len(a.Images) != 3 || len(a.SBOMs) != 3 {
		t.Fatalf("archive: index %s name %s, %d images, %d SBOMs; want %s, 3 and 3", a.Index, a.Name, len(a.Images), len(a.SBOMs), digest)
	}
	if want := "registry.example.com/ephemera/scratch@" + digest; a.ByDigest != want {
		t.Errorf("archive: the index's second name is %q, want %s", a.ByDigest, want)
	}
	for ref, want := range map[string]string{
		"registry.example.com/ephemera/scratch:v0.98.7@" + digest:                 "",
		"registry.example.com/ephemera/scratch@" + digest:                         "",
		"registry.example.com/ephemera/scratch:v0.98.7":                           "no digest",
		"registry.example.com/ephemera/scratch:v0.1.0@" + digest:                  "not the archive's image",
		"registry.example.com/other@" + digest:                                    "not the archive's image",
		"registry.example.com/ephemera/scratch@" + a.Images["linux/amd64"]:        "is in the archive but is not its index",
		"registry.example.com/ephemera/scratch@sha256:" + strings.Repeat("0", 64): "is not in the archive",
	} {
		if got := a.Resolves(ref); (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("Resolves(%s) = %q, want %q", ref, got, want)
		}
	}
	// The notes are the changelog's Unreleased section (no "## v0.98.7" there).
	notes, _ := os.ReadFile(filepath.Join(r.Out, NotesFile))
	if !strings.Contains(string(notes), "(docs/changelog.md, Unreleased") {
		t.Errorf("%s does not say which changelog section it is", NotesFile)
	}
	// The packaged chart's README and schema came along.
	if b, _ := os.ReadFile(filepath.Join(r.Out, r.ChartArchive())); len(b) < 1000 {
		t.Errorf("%s: %d bytes", r.ChartArchive(), len(b))
	}

	// The bundle stands alone: the docs its notes point at are in it, and the
	// chart's profiles are rendered, the image in the manifests' one form and no
	// registrar sidecar (its image is not in the archive).
	if !strings.Contains(string(notes), `docs/operations.md, "Installing a release"`) {
		t.Errorf("%s does not point at docs/operations.md", NotesFile)
	}
	for _, d := range BundleDocs {
		if _, err := os.Stat(filepath.Join(r.Out, d)); err != nil {
			t.Errorf("the bundle's docs: %v", err)
		}
	}
	for _, f := range []string{"chart-linux.yaml", "chart-linux-windows-hostprocess.yaml"} {
		b, err := os.ReadFile(filepath.Join(r.Out, ManifestsDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if s := string(b); !strings.Contains(s, `image: "registry.example.com/ephemera/scratch:v0.98.7@`+digest+`"`) ||
			strings.Contains(s, "image: \"registry.k8s.io/") || strings.Contains(s, `image: "registry.example.com/ephemera/scratch@`) {
			t.Errorf("%s: want the release's image as REPO:VERSION@DIGEST and no registrar sidecar:\n%s", f, s)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(r.Out, ManifestsDir, "chart-linux-windows-hostprocess.yaml")); !strings.Contains(string(b), "kubernetes.io/os: windows") {
		t.Errorf("chart-linux-windows-hostprocess.yaml has no Windows DaemonSet")
	}

	// A bundle naming the linux/amd64 manifest instead of the index, a krew
	// manifest with a wrong checksum, a file not in SHA256SUMS, an archive whose
	// index.json names the index by its tag only.
	archive := filepath.Join(r.Out, r.ImageArchive())
	if err := editTar(archive, "index.json", func(b []byte) []byte {
		var idx map[string]any
		if err := json.Unmarshal(b, &idx); err != nil {
			t.Fatal(err)
		}
		idx["manifests"] = idx["manifests"].([]any)[:1]
		b, _ = json.Marshal(idx)
		return b
	}); err != nil {
		t.Fatal(err)
	}
	linux := filepath.Join(r.Out, ManifestsDir, "ephemera-scratch-linux.yaml")
	b, err := os.ReadFile(linux)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(linux, bytes.ReplaceAll(b, []byte("@"+digest), []byte("@"+a.Images["linux/amd64"])), 0o644); err != nil {
		t.Fatal(err)
	}
	krew := filepath.Join(r.Out, KrewFile)
	k, _ := os.ReadFile(krew)
	sum, _ := fileSHA256(filepath.Join(r.Out, r.PluginArchive("linux/amd64")))
	if err := os.WriteFile(krew, bytes.ReplaceAll(k, []byte(sum), []byte(strings.Repeat("ab", 32))), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.Out, "extra.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(r.Out, "docs", "security.md")); err != nil {
		t.Fatal(err)
	}
	_, err = CheckRelease(r.Out, want)
	for _, w := range []string{
		"ephemera-scratch-linux.yaml: DaemonSet ephemera-scratch-node container driver: image",
		"is in the archive but is not its index",
		"manifests/ephemera-scratch-linux.yaml: sha256",
		"extra.txt is not listed",
		"krew/ephemera.yaml: linux/amd64: sha256 abab",
		"the index is not also named registry.example.com/ephemera/scratch@" + digest,
		"the bundle's docs: docs/security.md",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("CheckRelease of a broken release: %v; want %q", err, w)
		}
	}
}

// editTar rewrites one file of a tar archive with edit.
func editTar(path, name string, edit func([]byte) []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var out bytes.Buffer
	tr, tw := tar.NewReader(f), tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if h.Name == name {
			b = edit(b)
			h.Size = int64(len(b))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// TestReleaseVersions: a vX.Y.Z release is its own module version; anything
// else (make test's git describe) a pseudo-version of the commit.
func TestReleaseVersions(t *testing.T) {
	at := time.Date(2026, 12, 5, 21, 0, 0, 0, time.UTC)
	for v, want := range map[string]string{
		"v0.3.0":        "v0.3.0",
		"v1.0.0-rc.1":   "v1.0.0-rc.1",
		"45d9977-dirty": "v0.0.0-20261205210000-45d9977cb958",
		"v0.3":          "v0.0.0-20261205210000-45d9977cb958",
	} {
		r := &Release{Version: v, Revision: "45d9977cb95898153fcd9a7d3ac173f36beb1c2b", Epoch: at}
		if got := r.ModuleVersion(); got != want {
			t.Errorf("ModuleVersion of %s = %s, want %s", v, got, want)
		}
	}
	if got := (&Release{Version: "v0.3.0"}).ChartArchive(); got != "ephemera-driver-0.3.0.tgz" {
		t.Errorf("chart archive %s", got)
	}
}

// TestAuthorBuildsAgainstRelease is docs/authors.md's "Building against a
// release" and "The image": examples/hello, its replace directive dropped and the release's
// version required, builds with the release's file-based module proxy
// (GOPROXY=file://.../goproxy, GONOSUMDB for the module). The other modules come
// from the module cache's download directory, itself a file proxy, into an
// empty module cache: nothing is fetched from the network and the release's
// module is the proxy's zip, not a checkout. With EPHEMERA_RELEASE_DIR (make
// release-check), the release there; else one of HEAD built here.
func TestAuthorBuildsAgainstRelease(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds examples/hello")
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("EPHEMERA_RELEASE_DIR")
	if dir == "" {
		r, _ := testRelease(t)
		if err := r.writeModuleProxy(); err != nil {
			t.Fatal(err)
		}
		dir = r.Out
	}
	list, err := os.ReadFile(filepath.Join(ModuleProxyDir(filepath.Join(dir, ProxyDir)), "list"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.Fields(string(list))[0]
	cache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	mod := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(root, "examples", "hello", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proxy, err := filepath.Abs(filepath.Join(dir, ProxyDir))
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(strings.TrimSpace(string(cache)), "cache", "download"),
		"GONOSUMDB="+Module, "GOFLAGS=-mod=mod -modcacherw", "GOMODCACHE="+filepath.Join(t.TempDir(), "modcache"),
		"GOTOOLCHAIN=local", "CGO_ENABLED=0", "GOWORK=off")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = mod, env
		if args[0] == "run" {
			// go run MODULE@VERSION checks its dependencies against the checksum
			// database, not the module's go.sum: no sum.golang.org here (an author's
			// machine has it), so the test turns the database off for it.
			cmd.Env = append(cmd.Env[:len(cmd.Env):len(cmd.Env)], "GOSUMDB=off")
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "edit", "-dropreplace="+Module, "-require="+Module+"@"+version)
	run("build", "-trimpath", "-tags", "grpcnotrace", "-o", filepath.Join(mod, "hello"), ".")
	if got := strings.TrimSpace(run("list", "-m", "-f", "{{.Version}} {{.Dir}}", Module)); !strings.HasPrefix(got, version+" ") || strings.HasPrefix(strings.Fields(got)[1], root) {
		t.Errorf("the example built with %s, want %s from the release's proxy", got, version)
	}
	sum, _ := os.ReadFile(filepath.Join(mod, "go.sum"))
	if !strings.Contains(string(sum), Module+" "+version+" h1:") {
		t.Errorf("go.sum has no hash of %s@%s", Module, version)
	}

	// docs/authors.md's "The image": the release's image builder (the nested module
	// deploy/images, from the proxy) builds the example's image from its module. No
	// -packages: no Debian index or .deb, nothing from the network.
	out := filepath.Join(t.TempDir(), "image")
	got := run("run", ImagesModule+"@"+version, "build", "-main", ".", "-name", "hello", "-platforms", "linux/amd64",
		"-out", out, "-archive", out+".tar", "-version", version, "-revision", "0123abc", "-source-date-epoch", "1700000000")
	if !strings.Contains(got, "image index sha256:") {
		t.Errorf("the release's builder said:\n%s", got)
	}
	idx, err := os.ReadFile(filepath.Join(out, "index.json"))
	var index struct {
		Manifests []struct{ Annotations map[string]string }
	}
	if err == nil {
		err = json.Unmarshal(idx, &index)
	}
	if err != nil || len(index.Manifests) != 1 || index.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != version {
		t.Errorf("the layout's index.json (%v):\n%s", err, idx)
	}
	if st, err := os.Stat(out + ".tar"); err != nil || st.Size() == 0 {
		t.Errorf("no OCI archive: %v", err)
	}
	if got := strings.TrimSpace(run("list", "-m", "-f", "{{.Version}}", ImagesModule+"@"+version)); got != version {
		t.Errorf("%s resolves to %s from the release's proxy, want %s", ImagesModule, got, version)
	}

	// docs/authors.md's "Without helm": the release's renderer (the nested module
	// test/manifests, from the proxy) renders the chart of the module cache's copy
	// of the release with the example's values.
	chart := filepath.Join(strings.TrimSpace(run("list", "-m", "-f", "{{.Dir}}", Module)), Chart)
	rendered := filepath.Join(t.TempDir(), "hello.yaml")
	// -trimpath as make manifests builds it: Helm's packages are build cache hits
	// although this module cache is another directory.
	run("run", "-trimpath", RenderModule+"/cmd/render@"+version, "-chart", chart, "-release", "hello",
		"-values", filepath.Join(root, "examples", "hello", "values.yaml"), "-out", rendered)
	if b, err := os.ReadFile(rendered); err != nil || !strings.Contains(string(b), "kind: DaemonSet") || !strings.Contains(string(b), "hello.csi.ephemera.dev") {
		t.Errorf("the release's renderer wrote (%v):\n%.2000s", err, b)
	}
}
