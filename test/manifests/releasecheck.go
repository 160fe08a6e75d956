package manifests

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"debug/pe"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
	"sigs.k8s.io/yaml"
)

const (
	mediaTypeOCIIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeOCIManifest = "application/vnd.oci.image.manifest.v1+json"
	sbomArtifactType     = "application/vnd.cyclonedx+json"
)

var digestPattern = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

// ImagePlatforms are the platforms of make image's index, each with an SBOM.
var ImagePlatforms = []string{"linux/amd64", "linux/arm64", "windows/amd64"}

// ReleasePluginPlatforms are the kubectl plugin's platforms in make release.
var ReleasePluginPlatforms = []string{"darwin/amd64", "darwin/arm64", "linux/amd64", "linux/arm64", "windows/amd64", "windows/arm64"}

// Expect is what CheckRelease holds a release to.
type Expect struct {
	Version, ImageRepo, ReleaseURL string
	// Root and Revision: the module zip's go.mod is the one at Revision; Epoch its
	// time (a test bundle's pseudo-version).
	Root, Revision string
	Epoch          time.Time
	// PluginPlatforms are the kubectl plugin's platforms (os/arch).
	PluginPlatforms []string
}

// Archive is an OCI layout archive read into memory.
type Archive struct {
	Name  string // io.containerd.image.name of the index (REPO:TAG)
	Index string // the index digest
	// ByDigest is the name of index.json's second descriptor of the index, if
	// any (REPO@DIGEST: what ctr images import names it too).
	ByDigest string
	Blobs    map[string][]byte
	Images   map[string]string // platform to image manifest digest
	SBOMs    map[string]string // platform to SBOM manifest digest
}

type descriptor struct {
	MediaType    string            `json:"mediaType"`
	Digest       string            `json:"digest"`
	Size         int64             `json:"size"`
	ArtifactType string            `json:"artifactType"`
	Annotations  map[string]string `json:"annotations"`
	Platform     *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type ociManifest struct {
	MediaType    string       `json:"mediaType"`
	ArtifactType string       `json:"artifactType"`
	Manifests    []descriptor `json:"manifests"`
	Config       descriptor   `json:"config"`
	Layers       []descriptor `json:"layers"`
	Subject      *descriptor  `json:"subject"`
}

// ReadArchive reads and checks an OCI layout archive: oci-layout, one index in
// index.json (described once, or twice: by name and by digest), every blob's content matching its digest, and every descriptor of
// the index, its images and SBOM artifacts resolving to a blob of the declared
// size.
func ReadArchive(path string) (*Archive, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[h.Name] = b
	}
	a := &Archive{Blobs: map[string][]byte{}, Images: map[string]string{}, SBOMs: map[string]string{}}
	var errs []error
	if !strings.Contains(string(files["oci-layout"]), `"imageLayoutVersion"`) {
		errs = append(errs, errors.New("no oci-layout file"))
	}
	for name, b := range files {
		hexd, ok := strings.CutPrefix(name, "blobs/sha256/")
		if !ok {
			continue
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != hexd {
			errs = append(errs, fmt.Errorf("blob %s: content's sha256 is %x", name, sum))
		}
		a.Blobs["sha256:"+hexd] = b
	}
	var top ociManifest
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", path, err)
	}
	if n := len(top.Manifests); n != 1 && n != 2 {
		return nil, fmt.Errorf("%s: index.json has %d descriptors, want one index, described once or twice (by name, by digest)", path, n)
	}
	d := top.Manifests[0]
	a.Name, a.Index = d.Annotations["io.containerd.image.name"], d.Digest
	if len(top.Manifests) == 2 {
		d2 := top.Manifests[1]
		if d2.Digest != d.Digest || d2.MediaType != d.MediaType || d2.Size != d.Size {
			return nil, fmt.Errorf("%s: index.json describes %s %s and %s %s, want one index", path, d.MediaType, d.Digest, d2.MediaType, d2.Digest)
		}
		a.ByDigest = d2.Annotations["io.containerd.image.name"]
	}
	blob := func(d descriptor, what string) []byte {
		b, ok := a.Blobs[d.Digest]
		if !ok {
			errs = append(errs, fmt.Errorf("%s %s: no blob in the archive", what, d.Digest))
			return nil
		}
		if int64(len(b)) != d.Size {
			errs = append(errs, fmt.Errorf("%s %s: %d bytes, the descriptor says %d", what, d.Digest, len(b), d.Size))
		}
		return b
	}
	var idx ociManifest
	if b := blob(d, "index"); b != nil {
		if err := json.Unmarshal(b, &idx); err != nil || d.MediaType != mediaTypeOCIIndex || idx.MediaType != mediaTypeOCIIndex {
			errs = append(errs, fmt.Errorf("index %s: not an OCI image index (%v)", d.Digest, err))
		}
	}
	subjects := map[string]string{} // image manifest digest to platform
	for _, m := range idx.Manifests {
		if m.ArtifactType == "" && m.Platform != nil {
			subjects[m.Digest] = m.Platform.OS + "/" + m.Platform.Architecture
		}
	}
	for _, m := range idx.Manifests {
		b := blob(m, "manifest")
		var man ociManifest
		if b == nil || json.Unmarshal(b, &man) != nil || m.MediaType != mediaTypeOCIManifest {
			errs = append(errs, fmt.Errorf("manifest %s: not an OCI image manifest", m.Digest))
			continue
		}
		blob(man.Config, "config of "+m.Digest)
		for _, l := range man.Layers {
			blob(l, "layer of "+m.Digest)
		}
		switch {
		case m.ArtifactType == sbomArtifactType:
			if man.Subject == nil || subjects[man.Subject.Digest] == "" {
				errs = append(errs, fmt.Errorf("SBOM %s: its subject is no image of the index", m.Digest))
				continue
			}
			if len(man.Layers) != 1 || !bytes.Contains(a.Blobs[man.Layers[0].Digest], []byte(`"bomFormat"`)) {
				errs = append(errs, fmt.Errorf("SBOM %s: no CycloneDX document", m.Digest))
			}
			a.SBOMs[subjects[man.Subject.Digest]] = m.Digest
		case m.Platform != nil:
			a.Images[subjects[m.Digest]] = m.Digest
		default:
			errs = append(errs, fmt.Errorf("manifest %s: neither a platform image nor an SBOM", m.Digest))
		}
	}
	return a, errors.Join(errs...)
}

// Resolves reports why ref does not name this archive's index ("" when it does):
// NAME[:TAG]@DIGEST with DIGEST the index's and NAME (and the tag, if any) its
// containerd name's.
func (a *Archive) Resolves(ref string) string {
	nameTag, digest, ok := strings.Cut(ref, "@")
	if !ok {
		return "no digest"
	}
	if digest != a.Index {
		if _, in := a.Blobs[digest]; in {
			return "digest " + digest + " is in the archive but is not its index"
		}
		return "digest " + digest + " is not in the archive"
	}
	repo, tag := splitTag(a.Name)
	r, t := splitTag(nameTag)
	if r != repo || (t != "" && t != tag) {
		return fmt.Sprintf("%s is not the archive's image %s", nameTag, a.Name)
	}
	return ""
}

func splitTag(ref string) (repo, tag string) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ref, ""
	}
	return ref[:i], ref[i+1:]
}

// CheckRelease checks a release directory (what make release wrote): checksums,
// the image archive, that every image of the manifests and of the chart resolves
// inside it, the kubectl plugin archives and krew manifest, the module proxy and
// the notes. It returns the archive.
func CheckRelease(dir string, want Expect) (*Archive, error) {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	r := &Release{Version: want.Version, Revision: want.Revision, ImageRepo: want.ImageRepo, Epoch: want.Epoch}
	if err := checkSums(dir); err != nil {
		fail("%s: %v", SumsFile, err)
	}
	a, err := ReadArchive(filepath.Join(dir, r.ImageArchive()))
	if a == nil {
		return nil, errors.Join(append(errs, err)...)
	}
	if err != nil {
		fail("%s: %v", r.ImageArchive(), err)
	}
	if a.Name != want.ImageRepo+":"+want.Version {
		fail("%s: the index is named %q, want %s:%s", r.ImageArchive(), a.Name, want.ImageRepo, want.Version)
	}
	// What a pod's REPO:TAG@DIGEST is looked up as in containerd's CRI.
	if a.ByDigest != want.ImageRepo+"@"+a.Index {
		fail("%s: the index is not also named %s@%s (named %q): ctr images import would not create the name a pod's image by digest is looked up by",
			r.ImageArchive(), want.ImageRepo, a.Index, a.ByDigest)
	}
	for _, p := range ImagePlatforms {
		if a.Images[p] == "" || a.SBOMs[p] == "" {
			fail("%s: platform %s: image %q, SBOM %q", r.ImageArchive(), p, a.Images[p], a.SBOMs[p])
		}
		if _, err := os.Stat(filepath.Join(dir, "sbom", "ephemera-scratch-"+want.Version+"-"+strings.ReplaceAll(p, "/", "-")+".cdx.json")); err != nil {
			fail("SBOM file of %s: %v", p, err)
		}
	}

	// The manifests: every image resolves inside the archive.
	images := 0
	for _, t := range BundleTargets() {
		b, err := os.ReadFile(filepath.Join(dir, ManifestsDir, t.File))
		if err != nil {
			fail("%v", err)
			continue
		}
		objs, err := Decode(b)
		if err != nil || len(objs) == 0 {
			fail("%s: %d objects, %v", t.File, len(objs), err)
			continue
		}
		for _, o := range objs {
			for _, c := range containers(o) {
				images++
				ref, _ := c.Get("image").(string)
				if why := a.Resolves(ref); why != "" {
					fail("%s: %s %s container %s: image %q: %s", t.File, o.Kind(), o.Name(), c.Name2(), ref, why)
				} else if !strings.HasPrefix(ref, want.ImageRepo+":"+want.Version+"@") {
					fail("%s: image %q does not name the version %s", t.File, ref, want.Version)
				}
			}
		}
	}
	if images < 2 {
		fail("manifests: %d containers, want the Linux and the Windows node plugin", images)
	}

	// The chart: its defaults run the release's index and nothing else, named as
	// the manifests name it; the sidecar registrar, the documented alternative,
	// pulls its own image.
	chart := filepath.Join(dir, r.ChartArchive())
	for name, vals := range map[string]map[string]any{
		"defaults":               {},
		"windows.enabled":        {"windows": map[string]any{"enabled": true}},
		"registrar.mode=sidecar": {"registrar": map[string]any{"mode": "sidecar"}},
	} {
		b, err := Helm(chart, vals, Namespace)
		if err != nil {
			fail("%s: %v", r.ChartArchive(), err)
			continue
		}
		tests, err := HelmTests(chart, vals, Namespace)
		if err != nil {
			fail("%s: helm test hooks: %v", r.ChartArchive(), err)
		}
		objs, err := Decode(append(b, append([]byte("\n---\n"), tests...)...))
		if err != nil {
			fail("%s: %v", r.ChartArchive(), err)
			continue
		}
		n := 0
		for _, o := range objs {
			for _, c := range containers(o) {
				ref, _ := c.Get("image").(string)
				if strings.HasPrefix(ref, "registry.k8s.io/sig-storage/csi-node-driver-registrar:") && name == "registrar.mode=sidecar" {
					continue // the sidecar mode's registrar: not ours
				}
				n++
				if why := a.Resolves(ref); why != "" {
					fail("%s (%s): %s %s container %s: image %q: %s", r.ChartArchive(), name, o.Kind(), o.Name(), c.Name2(), ref, why)
				} else if !strings.HasPrefix(ref, want.ImageRepo+":"+want.Version+"@") {
					fail("%s (%s): image %q does not name the version %s as the manifests do", r.ChartArchive(), name, ref, want.Version)
				}
			}
		}
		if n == 0 {
			fail("%s (%s): no container of the driver's image", r.ChartArchive(), name)
		}
	}
	if err := checkChartMeta(chart, r); err != nil {
		fail("%s: %v", r.ChartArchive(), err)
	}

	if err := checkKrew(dir, r, want); err != nil {
		fail("%s: %v", KrewFile, err)
	}
	if err := checkModuleProxy(dir, r, want); err != nil {
		fail("%s: %v", ProxyDir, err)
	}
	for _, d := range BundleDocs {
		if b, err := os.ReadFile(filepath.Join(dir, d)); err != nil || len(b) == 0 {
			fail("the bundle's docs: %s: %v", d, err)
		}
	}
	notes, err := os.ReadFile(filepath.Join(dir, NotesFile))
	if err != nil || !bytes.HasPrefix(notes, []byte("# Ephemera "+want.Version+"\n")) || !bytes.Contains(notes, []byte(a.Index)) || !bytes.Contains(notes, []byte("\n### ")) {
		fail("%s: want a heading naming %s, the index digest and the changelog's sections (%v)", NotesFile, want.Version, err)
	}
	return a, errors.Join(errs...)
}

func checkSums(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, SumsFile))
	if err != nil {
		return err
	}
	listed := map[string]bool{}
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			errs = append(errs, fmt.Errorf("line %q", sc.Text()))
			continue
		}
		listed[name] = true
		got, err := fileSHA256(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			errs = append(errs, err)
		} else if got != sum {
			errs = append(errs, fmt.Errorf("%s: sha256 %s, listed %s", name, got, sum))
		}
	}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel = filepath.ToSlash(rel); rel != SumsFile && !listed[rel] {
			errs = append(errs, fmt.Errorf("%s is not listed", rel))
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

func checkChartMeta(chart string, r *Release) error {
	b, err := tarGzFile(chart, "ephemera-driver/Chart.yaml")
	if err != nil {
		return err
	}
	var meta struct{ Version, AppVersion string }
	if err := yaml.Unmarshal(b, &meta); err != nil {
		return err
	}
	if meta.Version != strings.TrimPrefix(r.ModuleVersion(), "v") || meta.AppVersion != r.Version {
		return fmt.Errorf("version %q appVersion %q, want %s and %s", meta.Version, meta.AppVersion, strings.TrimPrefix(r.ModuleVersion(), "v"), r.Version)
	}
	return nil
}

// tarGzFile reads the file name out of the .tar.gz archive at path.
func tarGzFile(path, name string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("no %s (%v)", name, err)
		}
		if h.Name == name {
			return io.ReadAll(tr)
		}
	}
}

func checkKrew(dir string, r *Release, want Expect) error {
	b, err := os.ReadFile(filepath.Join(dir, KrewFile))
	if err != nil {
		return err
	}
	var k krewPlugin
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		return err
	}
	var errs []error
	if k.Kind != "Plugin" || k.Metadata.Name != "ephemera" || k.Spec.Version != want.Version {
		errs = append(errs, fmt.Errorf("kind %s name %s version %s", k.Kind, k.Metadata.Name, k.Spec.Version))
	}
	var got []string
	for _, p := range k.Spec.Platforms {
		plat := p.Selector.MatchLabels["os"] + "/" + p.Selector.MatchLabels["arch"]
		got = append(got, plat)
		name := r.PluginArchive(plat)
		if p.URI != strings.TrimSuffix(want.ReleaseURL, "/")+"/"+name {
			errs = append(errs, fmt.Errorf("%s: uri %s, want %s/%s", plat, p.URI, want.ReleaseURL, name))
		}
		sum, err := fileSHA256(filepath.Join(dir, name))
		if err != nil || sum != p.SHA256 {
			errs = append(errs, fmt.Errorf("%s: sha256 %s, the file's %s (%v)", plat, p.SHA256, sum, err))
			continue
		}
		if err := checkPluginArchive(filepath.Join(dir, name), p.Bin, plat); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", name, err))
		}
	}
	sort.Strings(got)
	if w := slices.Sorted(slices.Values(want.PluginPlatforms)); !slices.Equal(got, w) {
		errs = append(errs, fmt.Errorf("platforms %v, want %v", got, w))
	}
	return errors.Join(errs...)
}

// checkPluginArchive: the archive holds bin, an executable of the platform.
func checkPluginArchive(path, bin, platform string) error {
	b, err := tarGzFile(path, bin)
	if err != nil {
		return err
	}
	goos, goarch, _ := strings.Cut(platform, "/")
	var arch string
	switch goos {
	case "linux":
		ef, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			return err
		}
		arch = map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}[ef.Machine]
	case "darwin":
		mf, err := macho.NewFile(bytes.NewReader(b))
		if err != nil {
			return err
		}
		arch = map[macho.Cpu]string{macho.CpuAmd64: "amd64", macho.CpuArm64: "arm64"}[mf.Cpu]
	case "windows":
		pf, err := pe.NewFile(bytes.NewReader(b))
		if err != nil {
			return err
		}
		arch = map[uint16]string{pe.IMAGE_FILE_MACHINE_AMD64: "amd64", pe.IMAGE_FILE_MACHINE_ARM64: "arm64"}[pf.Machine]
	}
	if arch != goarch {
		return fmt.Errorf("%s is a %s/%q executable, want %s", bin, goos, arch, platform)
	}
	return nil
}

func checkModuleProxy(dir string, r *Release, want Expect) error {
	v := r.ModuleVersion()
	at := ModuleProxyDir(filepath.Join(dir, ProxyDir))
	var errs []error
	var info struct{ Version, Time string }
	b, err := os.ReadFile(filepath.Join(at, v+".info"))
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	if err != nil || info.Version != v || info.Time == "" {
		errs = append(errs, fmt.Errorf("%s.info: %+v (%v), want version %s", v, info, err, v))
	}
	if list, err := os.ReadFile(filepath.Join(at, "list")); err != nil || !slices.Contains(strings.Fields(string(list)), v) {
		errs = append(errs, fmt.Errorf("list does not name %s (%v)", v, err))
	}
	mod, err := os.ReadFile(filepath.Join(at, v+".mod"))
	wantMod, werr := gitOutput(want.Root, "show", want.Revision+":go.mod")
	if err != nil || werr != nil || !bytes.Equal(mod, wantMod) {
		errs = append(errs, fmt.Errorf("%s.mod is not go.mod at %s (%v, %v)", v, want.Revision, err, werr))
	}
	cf, err := modzip.CheckZip(module.Version{Path: Module, Version: v}, filepath.Join(at, v+".zip"))
	if err == nil {
		err = cf.Err()
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("%s.zip: %v", v, err))
	}
	prefix := Module + "@" + v + "/"
	for _, f := range []string{"go.mod", "LICENSE", "framework/driver.go", "drivers/scratch/main.go"} {
		if !slices.Contains(cf.Valid, prefix+f) {
			errs = append(errs, fmt.Errorf("%s.zip: no %s", v, f))
		}
	}
	for _, f := range cf.Valid {
		f = strings.TrimPrefix(f, prefix)
		nested := strings.HasPrefix(f, "examples/hello/")
		for _, m := range NestedModules {
			nested = nested || strings.HasPrefix(f, m.Dir+"/")
		}
		if nested {
			errs = append(errs, fmt.Errorf("%s.zip holds %s of a nested module", v, f))
			break
		}
	}
	// The nested modules: each one's go.mod and files below its directory.
	for _, m := range NestedModules {
		at := ModulePathProxyDir(filepath.Join(dir, ProxyDir), m.Path)
		mod, err := os.ReadFile(filepath.Join(at, v+".mod"))
		wantMod, werr := gitOutput(want.Root, "show", want.Revision+":"+m.Dir+"/go.mod")
		if err != nil || werr != nil || !bytes.Equal(mod, wantMod) {
			errs = append(errs, fmt.Errorf("%s@%s.mod is not %s/go.mod at %s (%v, %v)", m.Path, v, m.Dir, want.Revision, err, werr))
		}
		if list, err := os.ReadFile(filepath.Join(at, "list")); err != nil || !slices.Contains(strings.Fields(string(list)), v) {
			errs = append(errs, fmt.Errorf("%s: list does not name %s (%v)", m.Path, v, err))
		}
		cf, err := modzip.CheckZip(module.Version{Path: m.Path, Version: v}, filepath.Join(at, v+".zip"))
		if err == nil {
			err = cf.Err()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s@%s.zip: %v", m.Path, v, err))
		}
		prefix := m.Path + "@" + v + "/"
		for _, f := range m.Files {
			if !slices.Contains(cf.Valid, prefix+f) {
				errs = append(errs, fmt.Errorf("%s@%s.zip: no %s", m.Path, v, f))
			}
		}
	}
	return errors.Join(errs...)
}
