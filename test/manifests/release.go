package manifests

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"
)

// Module is the path of the framework's Go module, which a release serves from its
// file-based module proxy.
const Module = "github.com/ephemera-csi/ephemera"

// PlaceholderImage is the driver image the checked-in manifests name: no registry
// serves it; an install sets the real one (a release's bundle names its index by
// version and digest; docs/operations.md, "Install").
const PlaceholderImage = "localhost/ephemera-scratch"

// Release is what `make release` builds into Out (docs/operations.md, "Releases").
type Release struct {
	// Version is the release's version: vX.Y.Z for a release; anything else (make
	// test's git describe) makes a test bundle whose module and chart versions are a
	// pseudo-version of Revision.
	Version string
	// Root is the repository's root; Revision the commit the module zip is made of.
	Root, Revision string
	// Epoch is every timestamp in the archives (the commit's time).
	Epoch time.Time
	// ImageLayout is make image's OCI layout; ImageRepo the name its index gets in
	// the archive (io.containerd.image.name, REPO:Version) and in the bundle.
	ImageLayout, ImageRepo string
	// ReleaseURL is where the files of Out are downloadable (the krew manifest's URIs).
	ReleaseURL string
	// Plugins maps os/arch to a kubectl-ephemera binary of that platform.
	Plugins map[string]string
	// Out is the directory written (made anew).
	Out string
}

// The files of a release, relative to Out.
const (
	SumsFile     = "SHA256SUMS"
	NotesFile    = "RELEASE-NOTES.md"
	KrewFile     = "krew/ephemera.yaml"
	ProxyDir     = "goproxy"
	ManifestsDir = "manifests"
	pluginName   = "kubectl-ephemera"
)

// ImageArchive is the release's OCI layout archive of the image index.
func (r *Release) ImageArchive() string { return "ephemera-scratch-" + r.Version + ".oci.tar" }

// ModuleVersion is the module's (and the packaged chart's, without the v) version:
// Version when it is a release version, else a pseudo-version of Revision.
func (r *Release) ModuleVersion() string {
	if IsReleaseVersion(r.Version) {
		return r.Version
	}
	rev := r.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return module.PseudoVersion("v0", "", r.Epoch, rev)
}

var releaseVersion = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// IsReleaseVersion reports whether v is vMAJOR.MINOR.PATCH[-PRERELEASE].
func IsReleaseVersion(v string) bool { return releaseVersion.MatchString(v) && semver.IsValid(v) }

// BundleTarget is one rendered manifest file of a release: a kustomization, or
// the packaged chart with values over its defaults.
type BundleTarget struct {
	File       string         // below ManifestsDir
	Kustomize  string         // the kustomization, relative to the repository root
	HelmValues map[string]any // with Kustomize "": the packaged chart's profile
}

// BundleTargets are what a release renders: the overlays and chart profiles whose
// every image is the release's index (the registrar sidecar's image is not in the
// archive: the Linux bundle registers the driver itself, and clusters without a
// registry need nothing else). The chart's profiles are `helm template` of the
// packaged chart, for an install without helm (docs/operations.md, "Installing a
// release").
func BundleTargets() []BundleTarget {
	return []BundleTarget{
		{File: "ephemera-scratch-linux.yaml", Kustomize: "deploy/overlays/linux-embedded-registrar"},
		{File: "ephemera-scratch-windows-hostprocess.yaml", Kustomize: "deploy/overlays/windows-hostprocess"},
		{File: "ephemera-admission.yaml", Kustomize: "deploy/admission"},
		{File: "chart-linux.yaml", HelmValues: map[string]any{}},
		{File: "chart-linux-windows-hostprocess.yaml", HelmValues: map[string]any{"windows": map[string]any{"enabled": true}}},
	}
}

// BundleDocs are the documents a release carries as plain files, at their paths
// in the repository, so that the links between them hold: what an operator and a
// driver author read (RELEASE-NOTES.md points into them).
var BundleDocs = []string{
	"README.md",
	"docs/operations.md",
	"docs/security.md",
	"docs/authors.md",
	Chart + "/README.md",
}

// Build writes the release into r.Out and returns the index digest.
func (r *Release) Build() (string, error) {
	if r.Version == "" || r.Revision == "" || r.ImageRepo == "" || r.ReleaseURL == "" || r.Epoch.IsZero() {
		return "", errors.New("release: the version, revision, image repository, release URL and epoch are required")
	}
	if strings.ContainsAny(r.ImageRepo, "@:") && !strings.Contains(r.ImageRepo, "/") {
		return "", fmt.Errorf("release: image repository %q: want a repository without tag or digest", r.ImageRepo)
	}
	if m := semver.Major(r.ModuleVersion()); m != "v0" && m != "v1" {
		return "", fmt.Errorf("release: version %s: the module path %s has no /%s suffix (Go's semantic import versioning)", r.Version, Module, m)
	}
	if err := os.RemoveAll(r.Out); err != nil {
		return "", err
	}
	if err := os.MkdirAll(r.Out, 0o755); err != nil {
		return "", err
	}
	digest, err := r.writeImageArchive()
	if err != nil {
		return "", fmt.Errorf("image archive: %w", err)
	}
	if err := r.copySBOMs(); err != nil {
		return "", fmt.Errorf("SBOMs: %w", err)
	}
	if err := r.writeChart(digest); err != nil {
		return "", fmt.Errorf("chart: %w", err)
	}
	if err := r.writeBundle(digest); err != nil {
		return "", fmt.Errorf("manifests: %w", err)
	}
	if err := r.writePlugins(); err != nil {
		return "", fmt.Errorf("kubectl plugin: %w", err)
	}
	if err := r.writeModuleProxy(); err != nil {
		return "", fmt.Errorf("module proxy: %w", err)
	}
	if err := r.writeDocs(); err != nil {
		return "", fmt.Errorf("docs: %w", err)
	}
	if err := r.writeNotes(digest); err != nil {
		return "", fmt.Errorf("release notes: %w", err)
	}
	return digest, WriteSums(r.Out)
}

// ---- the image archive

// writeImageArchive writes the OCI layout as a tar (files in name order, every
// timestamp the epoch) whose index.json describes the index twice, as `ctr images
// export` of the two names would: named ImageRepo:Version for containerd
// (io.containerd.image.name; `ctr images import` takes the name from it) and
// tagged Version (org.opencontainers.image.ref.name); and named
// ImageRepo@<index digest>, untagged. The kubelet looks a pod's
// REPO:TAG@DIGEST up in containerd's CRI as REPO@DIGEST, a name a plain `ctr
// images import` creates only from this second descriptor (its --digests names
// the digest image after --base-name on 1.6, and on containerd 2's transfer
// service after the layout's own index.json): with it one command loads the
// release on containerd 1.6 and 2.x, and a pod naming the release by digest
// finds it without a pull. Tools that pick one image of an OCI layout
// (skopeo's oci-archive:FILE:TAG) select the first by its tag.
func (r *Release) writeImageArchive() (string, error) {
	b, err := os.ReadFile(filepath.Join(r.ImageLayout, "index.json"))
	if err != nil {
		return "", err
	}
	var idx map[string]any
	if err := json.Unmarshal(b, &idx); err != nil {
		return "", fmt.Errorf("%s/index.json: %w", r.ImageLayout, err)
	}
	ms, _ := idx["manifests"].([]any)
	if len(ms) != 1 {
		return "", fmt.Errorf("%s/index.json: %d descriptors, want make image's one index", r.ImageLayout, len(ms))
	}
	desc, _ := ms[0].(map[string]any)
	digest, _ := desc["digest"].(string)
	if mt, _ := desc["mediaType"].(string); mt != mediaTypeOCIIndex || !digestPattern.MatchString(digest) {
		return "", fmt.Errorf("%s/index.json: the descriptor is %s %s, want an OCI image index", r.ImageLayout, mt, digest)
	}
	byDigest := maps.Clone(desc)
	desc["annotations"] = map[string]any{
		"io.containerd.image.name":          r.ImageRepo + ":" + r.Version,
		"org.opencontainers.image.ref.name": r.Version,
	}
	byDigest["annotations"] = map[string]any{"io.containerd.image.name": r.ImageRepo + "@" + digest}
	idx["manifests"] = []any{desc, byDigest}
	index, err := json.MarshalIndent(idx, "", "   ")
	if err != nil {
		return "", err
	}
	var files []string
	err = filepath.WalkDir(r.ImageLayout, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(r.ImageLayout, p)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	f, err := os.Create(filepath.Join(r.Out, r.ImageArchive()))
	if err != nil {
		return "", err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, name := range files {
		if name == "index.json" {
			err = addTarFile(tw, name, index, 0o644, r.Epoch)
		} else {
			var body []byte
			if body, err = os.ReadFile(filepath.Join(r.ImageLayout, name)); err == nil {
				err = addTarFile(tw, name, body, 0o644, r.Epoch)
			}
		}
		if err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return digest, f.Close()
}

func addTarFile(tw *tar.Writer, name string, body []byte, mode int64, t time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(body)), ModTime: t, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := tw.Write(body)
	return err
}

// copySBOMs copies make image's SBOM files (IMAGE_OUT.sbom/) beside the archive,
// which carries them too (as artifacts in the index).
func (r *Release) copySBOMs() error {
	dir := r.ImageLayout + ".sbom"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	out := filepath.Join(r.Out, "sbom")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, "ephemera-scratch-"+r.Version+"-"+e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ---- the chart

// ChartArchive is the packaged chart's file name (helm package's: NAME-VERSION.tgz).
func (r *Release) ChartArchive() string {
	return "ephemera-driver-" + strings.TrimPrefix(r.ModuleVersion(), "v") + ".tgz"
}

// writeChart packages the chart as `helm package --version V --app-version
// Version` would (a gzipped tar of its files below ephemera-driver/, .helmignore
// applied), its defaults the release's chartValues, so that `helm install` of the
// archive runs the released image and nothing the archive does not hold.
func (r *Release) writeChart(digest string) error {
	ch, err := loader.Load(filepath.Join(r.Root, Chart))
	if err != nil {
		return err
	}
	ch.Metadata.Version = strings.TrimPrefix(r.ModuleVersion(), "v")
	ch.Metadata.AppVersion = r.Version
	meta, err := yaml.Marshal(ch.Metadata)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	gz.ModTime = r.Epoch
	tw := tar.NewWriter(gz)
	name := ch.Metadata.Name
	files := slices.Clone(ch.Raw)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	seenValues := false
	for _, f := range files {
		body := f.Data
		switch f.Name {
		case "Chart.yaml":
			body = meta
		case "values.yaml":
			seenValues = true
			if body, err = setValues(body, r.chartValues(digest)); err != nil {
				return err
			}
		}
		if err := addTarFile(tw, name+"/"+f.Name, body, 0o644, r.Epoch); err != nil {
			return err
		}
	}
	if !seenValues {
		return errors.New("the chart has no values.yaml")
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.Out, r.ChartArchive()), buf.Bytes(), 0o644)
}

// chartValues are the packaged chart's defaults that differ from the
// repository's: the release's index by version and digest (the manifests' form,
// REPO:VERSION@DIGEST), and the driver registering itself, so that the chart's
// defaults run nothing the archive does not hold (the registrar sidecar is the
// documented alternative: registrar.mode=sidecar pulls its image).
func (r *Release) chartValues(digest string) map[string]string {
	return map[string]string{
		"image.repository": r.ImageRepo,
		"image.tag":        r.Version,
		"image.digest":     digest,
		"registrar.mode":   "embedded",
	}
}

// setValues sets each block.key of set in the chart's values.yaml text (its
// comments kept): the line "  key: ..." of the top-level "block:".
func setValues(values []byte, set map[string]string) ([]byte, error) {
	lines := strings.Split(string(values), "\n")
	done := map[string]bool{}
	block := ""
	for i, l := range lines {
		switch {
		case l != "" && !strings.HasPrefix(l, " ") && !strings.HasPrefix(l, "#"):
			block = strings.TrimSuffix(l, ":")
		case strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "   "):
			key, _, ok := strings.Cut(strings.TrimPrefix(l, "  "), ": ")
			if v, want := set[block+"."+key]; ok && want {
				lines[i], done[block+"."+key] = "  "+key+": "+v, true
			}
		}
	}
	for k := range set {
		if !done[k] {
			return nil, fmt.Errorf("values.yaml: no %s line to set", k)
		}
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// ---- the kustomize bundle

// writeBundle renders BundleTargets with the driver image set to the release's
// index by version and digest: kustomize's images transformer on each overlay,
// the packaged chart's defaults for its profiles.
func (r *Release) writeBundle(digest string) error {
	dir := filepath.Join(r.Out, ManifestsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, t := range BundleTargets() {
		var (
			b    []byte
			err  error
			from string
		)
		if t.Kustomize != "" {
			b, err = KustomizeWithImage(filepath.Join(r.Root, t.Kustomize), PlaceholderImage, r.ImageRepo, r.Version, digest)
			from = t.Kustomize + " (kustomize build)"
		} else {
			b, err = Helm(filepath.Join(r.Out, r.ChartArchive()), t.HelmValues, Namespace)
			from = fmt.Sprintf("helm template ephemera-scratch %s --namespace %s", r.ChartArchive(), Namespace)
			for _, k := range slices.Sorted(maps.Keys(t.HelmValues)) {
				v, _ := json.Marshal(t.HelmValues[k])
				from += fmt.Sprintf(" --set-json '%s=%s'", k, v)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", t.File, err)
		}
		head := fmt.Sprintf("# Ephemera %s: %s, the driver image %s:%s@%s.\n",
			r.Version, from, r.ImageRepo, r.Version, digest)
		if err := os.WriteFile(filepath.Join(dir, t.File), append([]byte(head), b...), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeDocs copies BundleDocs into Out.
func (r *Release) writeDocs() error {
	for _, d := range BundleDocs {
		b, err := os.ReadFile(filepath.Join(r.Root, d))
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(r.Out, d)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(r.Out, d), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// KustomizeWithImage renders the kustomization dir with an overlay of its own on
// it that sets the image name to newName:tag@digest (what `kustomize edit set
// image name=newName:tag@digest` writes).
func KustomizeWithImage(dir, name, newName, tag, digest string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "ephemera-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	rel, err := filepath.Rel(tmp, dir) // kustomize refuses absolute resource paths
	if err != nil {
		return nil, err
	}
	k := fmt.Sprintf("resources:\n- %s\nimages:\n- name: %s\n  newName: %s\n  newTag: %s\n  digest: %s\n", rel, name, newName, tag, digest)
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, err
	}
	return Kustomize(tmp)
}

// ---- the kubectl plugin and its krew manifest

// PluginArchive is the file name of the kubectl plugin's archive for os/arch.
func (r *Release) PluginArchive(platform string) string {
	return pluginName + "_" + r.Version + "_" + strings.ReplaceAll(platform, "/", "_") + ".tar.gz"
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string `json:"uri"`
	SHA256 string `json:"sha256"`
	Files  []struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"files"`
	Bin string `json:"bin"`
}

type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string         `json:"version"`
		Homepage         string         `json:"homepage"`
		ShortDescription string         `json:"shortDescription"`
		Description      string         `json:"description"`
		Platforms        []krewPlatform `json:"platforms"`
	} `json:"spec"`
}

// writePlugins writes one tar.gz per platform (the binary and LICENSE) and the krew
// manifest naming them below ReleaseURL with their sha256.
func (r *Release) writePlugins() error {
	if len(r.Plugins) == 0 {
		return errors.New("no kubectl-ephemera binaries")
	}
	license, err := os.ReadFile(filepath.Join(r.Root, "LICENSE"))
	if err != nil {
		return err
	}
	var k krewPlugin
	k.APIVersion, k.Kind, k.Metadata.Name = "krew.googlecontainertools.github.com/v1alpha2", "Plugin", "ephemera"
	k.Spec.Version = r.Version
	k.Spec.Homepage = "https://github.com/ephemera-csi/ephemera"
	k.Spec.ShortDescription = "List the Ephemera scratch driver's volumes on each node"
	k.Spec.Description = "kubectl ephemera volumes [--node NODE] [-o table|json] asks every node plugin of the\n" +
		"Ephemera scratch driver (kube-system) what it holds: volumes, pods, backends, sizes.\n" +
		"It needs list on pods and get on pods/proxy in the driver's namespace.\n"
	platforms := make([]string, 0, len(r.Plugins))
	for p := range r.Plugins {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	for _, p := range platforms {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok {
			return fmt.Errorf("platform %q: want os/arch", p)
		}
		bin, err := os.ReadFile(r.Plugins[p])
		if err != nil {
			return err
		}
		exe := pluginName
		if goos == "windows" {
			exe += ".exe"
		}
		var buf bytes.Buffer
		gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		gz.ModTime = r.Epoch
		tw := tar.NewWriter(gz)
		if err := addTarFile(tw, exe, bin, 0o755, r.Epoch); err != nil {
			return err
		}
		if err := addTarFile(tw, "LICENSE", license, 0o644, r.Epoch); err != nil {
			return err
		}
		if err := tw.Close(); err != nil {
			return err
		}
		if err := gz.Close(); err != nil {
			return err
		}
		name := r.PluginArchive(p)
		if err := os.WriteFile(filepath.Join(r.Out, name), buf.Bytes(), 0o644); err != nil {
			return err
		}
		sum := sha256.Sum256(buf.Bytes())
		var kp krewPlatform
		kp.Selector.MatchLabels = map[string]string{"os": goos, "arch": goarch}
		kp.URI = strings.TrimSuffix(r.ReleaseURL, "/") + "/" + name
		kp.SHA256 = hex.EncodeToString(sum[:])
		kp.Files = append(kp.Files, struct {
			From string `json:"from"`
			To   string `json:"to"`
		}{exe, "."}, struct {
			From string `json:"from"`
			To   string `json:"to"`
		}{"LICENSE", "."})
		kp.Bin = exe
		k.Spec.Platforms = append(k.Spec.Platforms, kp)
	}
	b, err := yaml.Marshal(k)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(r.Out, filepath.Dir(KrewFile)), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.Out, KrewFile), b, 0o644)
}

// ---- the module proxy

// ImagesModule is the image builder's module (deploy/images, nested in the
// repository): released with the module's version, tagged deploy/images/VERSION as Go
// finds a nested module's versions, so that an author runs
// go run github.com/ephemera-csi/ephemera/deploy/images@VERSION build ... (docs/authors.md,
// "The image").
const ImagesModule = Module + "/deploy/images"

// RenderModule is this module (test/manifests), released beside the others for its
// chart renderer, so that `helm template` of the chart runs without helm and without
// a checkout: go run github.com/ephemera-csi/ephemera/test/manifests/cmd/render@VERSION
// -chart ... (docs/authors.md, "Without helm").
const RenderModule = Module + "/test/manifests"

// NestedModule is a module nested in the repository that a release serves.
type NestedModule struct {
	Path, Dir string   // the module path; its directory in the repository
	Files     []string // files the release's zip of it must hold
}

// NestedModules are the nested modules a release's goproxy/ carries, at the
// module's version: what an author runs from a release.
var NestedModules = []NestedModule{
	{Path: ImagesModule, Dir: "deploy/images", Files: []string{"go.mod", "go.sum", "main.go", "build.go", "debian.pins"}},
	{Path: RenderModule, Dir: "test/manifests", Files: []string{"go.mod", "go.sum", "render.go", "cmd/render/main.go"}},
}

// ModuleProxyDir is the directory of the module's .info, .mod and .zip below the
// file-based proxy (GOPROXY=file://OUT/goproxy).
func ModuleProxyDir(proxy string) string { return ModulePathProxyDir(proxy, Module) }

// ModulePathProxyDir is the directory of a module path's @v files below the proxy.
func ModulePathProxyDir(proxy, path string) string {
	return filepath.Join(proxy, filepath.FromSlash(path), "@v")
}

// writeModuleProxy writes the module and NestedModules at Revision as a GOPROXY
// protocol directory: for each, @v/list, VERSION.info, VERSION.mod (go.mod at
// Revision) and VERSION.zip (the module zip format, golang.org/x/mod/zip: what `go mod
// download` would fetch from a VCS, nested modules such as examples/ and
// test/manifests left out of the module's). Their dependencies are not in it: authors
// add the module cache or proxy.golang.org after it (GOPROXY=file://.../goproxy,https://proxy.golang.org).
func (r *Release) writeModuleProxy() error {
	archive, err := gitOutput(r.Root, "-c", "core.autocrlf=input", "-c", "core.eol=lf", "archive", "--format=zip", r.Revision)
	if err != nil {
		return err
	}
	zr, err := zip.NewReader(bytes.NewReader(archive), int64(len(archive)))
	if err != nil {
		return err
	}
	if err := r.writeModule(zr, Module, ""); err != nil {
		return err
	}
	for _, m := range NestedModules {
		if err := r.writeModule(zr, m.Path, m.Dir+"/"); err != nil {
			return err
		}
	}
	return nil
}

// writeModule writes one module of the archive, the files below prefix, as path.
func (r *Release) writeModule(zr *zip.Reader, path, prefix string) error {
	v := r.ModuleVersion()
	dir := ModulePathProxyDir(filepath.Join(r.Out, ProxyDir), path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var files []modzip.File
	var gomod []byte
	for _, f := range zr.File {
		name, ok := strings.CutPrefix(f.Name, prefix)
		if strings.HasSuffix(f.Name, "/") || !ok {
			continue
		}
		files = append(files, gitFile{f, name})
		if name == "go.mod" {
			rc, err := f.Open()
			if err != nil {
				return err
			}
			gomod, err = io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return err
			}
		}
	}
	if gomod == nil {
		return fmt.Errorf("no %sgo.mod at %s", prefix, r.Revision)
	}
	var zbuf bytes.Buffer
	if err := modzip.Create(&zbuf, module.Version{Path: path, Version: v}, files); err != nil {
		return fmt.Errorf("%s@%s: %w", path, v, err)
	}
	origin := map[string]string{"VCS": "git", "Hash": r.Revision}
	if prefix != "" {
		origin["Subdir"] = strings.TrimSuffix(prefix, "/")
	}
	info, err := json.Marshal(struct {
		Version string
		Time    string
		Origin  map[string]string `json:",omitempty"`
	}{v, r.Epoch.UTC().Format(time.RFC3339), origin})
	if err != nil {
		return err
	}
	for name, body := range map[string][]byte{
		"list": []byte(v + "\n"), v + ".info": info, v + ".mod": gomod, v + ".zip": zbuf.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// gitFile is a file of git's archive, named relative to its module's root.
type gitFile struct {
	f    *zip.File
	name string
}

func (g gitFile) Path() string                 { return g.name }
func (g gitFile) Lstat() (os.FileInfo, error)  { return g.f.FileInfo(), nil }
func (g gitFile) Open() (io.ReadCloser, error) { return g.f.Open() }

func gitOutput(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// ---- release notes

// writeNotes writes the release notes: the changelog's section of Version ("##
// vX.Y.Z ..."), else its "## Unreleased" section, under a heading naming the
// version, the index digest and how to install.
func (r *Release) writeNotes(digest string) error {
	b, err := os.ReadFile(filepath.Join(r.Root, "docs", "changelog.md"))
	if err != nil {
		return err
	}
	section, from := ChangelogSection(string(b), r.Version)
	if section == "" {
		return fmt.Errorf("docs/changelog.md has neither a \"## %s\" nor a \"## Unreleased\" section", r.Version)
	}
	var s strings.Builder
	fmt.Fprintf(&s, "# Ephemera %s\n\n", r.Version)
	fmt.Fprintf(&s, "Image index `%s:%s@%s` (linux/amd64, linux/arm64, windows/amd64 HostProcess, an SBOM each) in `%s`; "+
		"chart `%s`; manifests in `%s/`; the Go modules %s, %s (the image builder) and %s (the chart's renderer) at %s in `%s/` (GOPROXY=file://...); checksums in `%s`. "+
		"Installing: docs/operations.md, \"Installing a release\".\n\n",
		r.ImageRepo, r.Version, digest, r.ImageArchive(), r.ChartArchive(), ManifestsDir, Module, ImagesModule, RenderModule, r.ModuleVersion(), ProxyDir, SumsFile)
	fmt.Fprintf(&s, "## Changes (docs/changelog.md, %s)\n\n%s\n", from, strings.TrimSpace(section))
	return os.WriteFile(filepath.Join(r.Out, NotesFile), []byte(s.String()), 0o644)
}

// ChangelogSection returns the body of the changelog's "## <version>" section, or
// of "## Unreleased" when there is none, and its heading.
func ChangelogSection(changelog, version string) (body, heading string) {
	find := func(match func(string) bool) (string, string) {
		lines := strings.Split(changelog, "\n")
		for i, l := range lines {
			if !strings.HasPrefix(l, "## ") || !match(strings.TrimPrefix(l, "## ")) {
				continue
			}
			end := len(lines)
			for j := i + 1; j < len(lines); j++ {
				if strings.HasPrefix(lines[j], "## ") {
					end = j
					break
				}
			}
			return strings.Join(lines[i+1:end], "\n"), strings.TrimPrefix(l, "## ")
		}
		return "", ""
	}
	if b, h := find(func(h string) bool { return h == version || strings.HasPrefix(h, version+" ") }); b != "" {
		return b, h
	}
	return find(func(h string) bool { return strings.HasPrefix(h, "Unreleased") })
}

// ---- checksums

// WriteSums writes SHA256SUMS over every other file below dir (sha256sum -c reads it).
func WriteSums(dir string) error {
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == SumsFile {
			return err
		}
		sum, err := fileSHA256(p)
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i][66:] < lines[j][66:] })
	return os.WriteFile(filepath.Join(dir, SumsFile), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
