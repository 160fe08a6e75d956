package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The platforms an index can hold, in its order.
var platforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64"},
	{OS: "windows", Architecture: "amd64"},
}

func platformString(p v1.Platform) string { return p.OS + "/" + p.Architecture }

// A debPackage is what the image carries of one Debian package: the named Files, or
// with All every file but documentation (a package of -packages), or else its shared
// libraries (a package one of those needs: everything below lib/, lib64/ and
// usr/lib/ but glibc's gconv modules). Every package's copyright file comes too.
type debPackage struct {
	Name  string
	Files []string
	All   bool
}

func (dp debPackage) keeps(name string) bool {
	switch {
	case dp.Files != nil:
		return contains(dp.Files, name)
	case dp.All:
		return !isDoc(name)
	}
	return isLib(name)
}

const (
	linuxPath   = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	windowsPath = `PATH=C:\Windows\system32;C:\Windows;C:\WINDOWS\System32\WindowsPowerShell\v1.0\;`

	// The SBOM artifact: OCI 1.1's artifactType and empty config.
	sbomArtifactType = "application/vnd.cyclonedx+json"
	emptyConfigType  = "application/vnd.oci.empty.v1+json"
	// On the SBOM's descriptor in the index: the platform whose image it describes.
	sbomForAnnotation = "dev.ephemera.sbom.platform"
)

type buildConfig struct {
	Name        string // the driver: its binary's and its image's name
	Description string // org.opencontainers.image.description
	Licenses    string // org.opencontainers.image.licenses (none if empty)
	// The driver's build: go build -trimpath of Main (a package of the module in Dir)
	// with CGO_ENABLED=0, Tags and Ldflags, for each platform, into BinOut.
	Dir, Main, Tags, Ldflags, BinOut string
	Binaries                         map[string]string // platform ("linux/amd64") to a driver binary built already (-bin)
	// The platforms of the index; a windows one in OptionalWindows is left out, said
	// so, when the driver does not build for Windows.
	Platforms       []v1.Platform
	OptionalWindows bool
	Packages        []string // the Debian packages the driver needs (their closure is resolved)
	Files           []string // if set, the files of Packages the image carries (else all but documentation)
	Pins            []pin
	PinsFile        string
	Offline         bool // never fetch a Packages index: the pins must hold the closure
	Suites          []suite
	Keyring         string
	Mirror          string // the .debs of bookworm and bookworm-updates
	SecurityMirror  string // the .debs of bookworm-security (pool/updates/)
	Cache           string
	Client          *http.Client
	Version         string
	Revision        string
	Source          string
	Epoch           time.Time
	Out             string // the OCI layout directory, made anew
	Archive         string // if set, the layout also as a tar (docker load / ctr import / skopeo oci-archive:)
	Repository      string // if set, the archive names the index Repository:Version and Repository@DIGEST (namedIndex)
	Log             io.Writer
	tempBinOut      bool // BinOut is a temporary directory, removed after the build
}

// mirrorOf is the mirror a pinned .deb is fetched from: the security archive's pool
// is pool/updates/, which the main archive does not have.
func (c *buildConfig) mirrorOf(p pin) string {
	if strings.HasPrefix(p.Filename, "pool/updates/") && c.SecurityMirror != "" {
		return c.SecurityMirror
	}
	return c.Mirror
}

func (c *buildConfig) linuxBinary() string   { return "usr/local/bin/" + c.Name }
func (c *buildConfig) windowsBinary() string { return c.Name + ".exe" }

type platformResult struct {
	Platform string
	Manifest v1.Hash
	SBOM     v1.Hash // the SBOM artifact's manifest
	SBOMFile string  // a copy of the SBOM beside the layout
}

type buildResult struct {
	Index     v1.Hash
	Platforms []platformResult
}

func (c *buildConfig) annotations() map[string]string {
	a := map[string]string{
		"org.opencontainers.image.title":       c.Name,
		"org.opencontainers.image.description": c.Description,
		"org.opencontainers.image.source":      c.Source,
		"org.opencontainers.image.revision":    c.Revision,
		"org.opencontainers.image.version":     c.Version,
		"org.opencontainers.image.created":     c.Epoch.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses":    c.Licenses,
	}
	for k, v := range a {
		if v == "" {
			delete(a, k)
		}
	}
	return a
}

// build writes the image index (an image and an SBOM artifact for each platform) as
// an OCI layout in c.Out: it builds the driver for each platform (or takes the
// binaries of -bin) and resolves the Debian packages' closure from the pins.
func build(c *buildConfig) (*buildResult, error) {
	if c.Epoch.IsZero() {
		return nil, errors.New("no SOURCE_DATE_EPOCH: the images' timestamps are the commit's")
	}
	if c.Revision == "" || c.Version == "" || c.Name == "" {
		return nil, errors.New("the name, revision and version are required")
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	bins, plats, err := c.binaries()
	if err != nil {
		return nil, err
	}
	closures, err := c.closures(plats)
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	res := &buildResult{}
	var adds []mutate.IndexAddendum
	for _, p := range plats {
		bin := bins[platformString(p)]
		var img v1.Image
		var debs []pin
		var err error
		if p.OS == "windows" {
			img, err = c.windowsImage(p, bin)
		} else {
			img, debs, err = c.linuxImage(p, bin, closures[p.Architecture])
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", platformString(p), err)
		}
		desc, err := partial.Descriptor(img)
		if err != nil {
			return nil, err
		}
		// go-containerregistry gives an image's descriptor the config's media type as its
		// artifactType; an image's entry in an index carries none (image-spec 1.1).
		desc.ArtifactType = ""
		desc.Platform = &v1.Platform{OS: p.OS, Architecture: p.Architecture}
		sbom, err := makeSBOM(c, p, bin, debs)
		if err != nil {
			return nil, fmt.Errorf("%s: SBOM: %w", platformString(p), err)
		}
		art, err := sbomArtifact(sbom, *desc, c.Epoch)
		if err != nil {
			return nil, err
		}
		artDigest, err := art.Digest()
		if err != nil {
			return nil, err
		}
		adds = append(adds,
			mutate.IndexAddendum{Add: describedImage{img, *desc}},
			mutate.IndexAddendum{Add: art, Descriptor: v1.Descriptor{
				Platform:     &v1.Platform{OS: "unknown", Architecture: "unknown"},
				ArtifactType: sbomArtifactType,
				Annotations:  map[string]string{sbomForAnnotation: platformString(p)},
			}})
		pr := platformResult{Platform: platformString(p), Manifest: desc.Digest, SBOM: artDigest}
		pr.SBOMFile = filepath.Join(c.Out+".sbom", strings.ReplaceAll(platformString(p), "/", "-")+".cdx.json")
		if err := os.MkdirAll(filepath.Dir(pr.SBOMFile), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(pr.SBOMFile, sbom, 0o644); err != nil {
			return nil, err
		}
		res.Platforms = append(res.Platforms, pr)
	}
	idx = mutate.AppendManifests(idx, adds...)
	idx = mutate.Annotations(idx, c.annotations()).(v1.ImageIndex)
	d, err := idx.Digest()
	if err != nil {
		return nil, err
	}
	res.Index = d
	if err := os.RemoveAll(c.Out); err != nil {
		return nil, err
	}
	lp, err := layout.Write(c.Out, empty.Index)
	if err != nil {
		return nil, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": c.Version,
	})); err != nil {
		return nil, err
	}
	if c.Archive != "" {
		var index []byte
		if c.Repository != "" {
			if index, err = namedIndex(c.Out, c.Repository, c.Version); err != nil {
				return nil, err
			}
		}
		if err := writeArchive(c.Out, c.Archive, c.Epoch, index); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (c *buildConfig) config(p v1.Platform, img v1.Image, entrypoint []string, env string, user string) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = p.OS, p.Architecture
	cf.Created = v1.Time{Time: c.Epoch}
	cf.Author = ""
	labels := c.annotations()
	labels["dev.ephemera.image.user"] = user
	cf.Config = v1.Config{Entrypoint: entrypoint, Env: []string{env}, Labels: labels}
	if p.OS == "linux" {
		cf.Config.User = "0:0"
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, c.annotations()).(v1.Image), nil
}

func (c *buildConfig) appendLayers(trees []*tree, comments []string) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for i, t := range trees {
		l, err := t.layer(c.Epoch)
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     l,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: c.Epoch}, CreatedBy: comments[i], Comment: "deploy/images (make image)"},
		})
		if err != nil {
			return nil, err
		}
	}
	return img, nil
}

// linuxImage: one layer of Debian files (the distroless way: the files of the pinned
// .debs, no package manager, dpkg's status.d for scanners) and one of the driver.
// closure is the pins of the packages' closure (roots first); selectPackages picks
// what of it the image carries.
func (c *buildConfig) linuxImage(p v1.Platform, bin string, closure []pin) (v1.Image, []pin, error) {
	base := newTree()
	debs := map[string]*deb{}
	load := func(pn pin) (*deb, error) {
		if d, ok := debs[pn.Package]; ok {
			return d, nil
		}
		data, err := fetchDeb(c.Client, c.mirrorOf(pn), c.Cache, pn)
		if err != nil {
			if errors.Is(err, errGone) {
				return nil, fmt.Errorf("%w\nDebian's mirror drops superseded versions: refresh the pins (`images pins`, for the scratch driver `make image-pins`) and commit them", err)
			}
			return nil, err
		}
		d, err := parseDeb(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pn.Filename, err)
		}
		if got := controlField(d.Control, "Version"); got != pn.Version {
			return nil, fmt.Errorf("%s: its control file says version %q, the pin %q", pn.Filename, got, pn.Version)
		}
		debs[pn.Package] = d
		return d, nil
	}
	sel, err := selectPackages(p.Architecture, c.Packages, c.Files, closure, load)
	if err != nil {
		return nil, nil, err
	}
	var used []pin
	for _, s := range sel {
		if err := addDeb(base, s.Spec, s.Deb); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s.Pin.Filename, err)
		}
		if err := base.file("var/lib/dpkg/status.d/"+s.Pin.Package, 0o644, []byte(statusStanza(s.Deb.Control))); err != nil {
			return nil, nil, err
		}
		used = append(used, s.Pin)
	}
	for _, f := range []struct {
		name string
		data string
	}{
		{"etc/passwd", "root:x:0:0:root:/root:/sbin/nologin\n"},
		{"etc/group", "root:x:0:\n"},
	} {
		if err := base.file(f.name, 0o644, []byte(f.data)); err != nil {
			return nil, nil, err
		}
	}
	if err := base.dir("tmp", 0o1777); err != nil {
		return nil, nil, err
	}
	if err := base.dir("root", 0o700); err != nil {
		return nil, nil, err
	}
	drv, err := os.ReadFile(bin)
	if err != nil {
		return nil, nil, err
	}
	top := newTree()
	if err := top.file(c.linuxBinary(), 0o755, drv); err != nil {
		return nil, nil, err
	}
	var names []string
	for _, u := range used {
		names = append(names, u.Package+"="+u.Version)
	}
	img, err := c.appendLayers([]*tree{base, top}, []string{
		"Debian bookworm " + p.Architecture + " files of " + strings.Join(names, " "),
		"/" + c.linuxBinary(),
	})
	if err != nil {
		return nil, nil, err
	}
	img, err = c.config(p, img, []string{"/" + c.linuxBinary()}, linuxPath, "root (uid 0): the node plugin mounts; docs/security.md")
	return img, used, err
}

func findPin(pins []pin, arch, name string) (pin, bool) {
	for _, p := range pins {
		if p.Arch == arch && p.Package == name {
			return p, true
		}
	}
	return pin{}, false
}

// statusStanza is a package's entry for /var/lib/dpkg/status.d (distroless's layout,
// which image scanners read): its control stanza, installed.
func statusStanza(control string) string {
	control = strings.TrimRight(control, "\n")
	var b strings.Builder
	for i, line := range strings.Split(control, "\n") {
		b.WriteString(line)
		b.WriteByte('\n')
		if i == 0 {
			b.WriteString("Status: install ok installed\n")
		}
	}
	return b.String()
}

func addDeb(t *tree, dp debPackage, d *deb) error {
	byName := map[string]debEntry{}
	for _, e := range d.Entries {
		byName[e.Name] = e
	}
	keep := func(e debEntry) error {
		if e.Type == tar.TypeLink {
			// A hard link becomes a copy: the layer need not hold its target.
			target, ok := byName[e.Linkname]
			if !ok || target.Type != tar.TypeReg {
				return fmt.Errorf("%s: hard link to %s, not a file of the package", e.Name, e.Linkname)
			}
			e = debEntry{Name: e.Name, Type: tar.TypeReg, Mode: target.Mode, Data: target.Data}
		}
		return t.add(e)
	}
	copyright := "usr/share/doc/" + dp.Name + "/copyright"
	if e, ok := byName[copyright]; ok && e.Type == tar.TypeReg {
		if err := keep(e); err != nil {
			return err
		}
	}
	if dp.Files != nil && !dp.All {
		for _, f := range dp.Files {
			e, ok := byName[f]
			if !ok {
				return fmt.Errorf("%s: not in package %s", f, dp.Name)
			}
			if err := keep(e); err != nil {
				return err
			}
		}
		return nil
	}
	n := 0
	for _, e := range d.Entries {
		if e.Type == tar.TypeDir || e.Name == copyright || !dp.keeps(e.Name) {
			continue
		}
		if err := keep(e); err != nil {
			return err
		}
		n++
	}
	if n == 0 && !dp.All {
		return fmt.Errorf("package %s has no file below lib/, lib64/ or usr/lib/", dp.Name)
	}
	return nil
}

// The HostProcess base layer, made the way the upstream base image
// (microsoft/windows-host-process-containers-base-image) makes it: a Files/ tree with
// a license text and the registry hive files that Windows' layer import checks for.
// Like upstream's v1.0.0 the hives are empty files; upstream later ships minimal valid
// hives, which Windows Server 2025 wants (docs/operations.md, "The image").
var hiveFiles = []string{"DEFAULT", "SAM", "SECURITY", "SOFTWARE", "SYSTEM"}

// windowsLicense is the text of Files/License.txt, the driver's name filled in.
const windowsLicense = `This layer holds no Windows files. A HostProcess container runs on the host's
filesystem; its image only carries the driver (Files/%s), found below
%%CONTAINER_SANDBOX_MOUNT_POINT%%. Ephemera is licensed under the Apache License 2.0.
`

func (c *buildConfig) windowsImage(p v1.Platform, bin string) (v1.Image, error) {
	base := newTree()
	if err := base.file("Files/License.txt", 0o644, []byte(fmt.Sprintf(windowsLicense, c.windowsBinary()))); err != nil {
		return nil, err
	}
	for _, h := range hiveFiles {
		if err := base.file(path.Join("Files/Windows/System32/config", h), 0o644, nil); err != nil {
			return nil, err
		}
	}
	drv, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	top := newTree()
	if err := top.file("Files/"+c.windowsBinary(), 0o755, drv); err != nil {
		return nil, err
	}
	img, err := c.appendLayers([]*tree{base, top}, []string{
		"HostProcess base layer (no Windows files; os.version unset: any Windows build)",
		c.windowsBinary(),
	})
	if err != nil {
		return nil, err
	}
	return c.config(p, img, []string{c.windowsBinary()}, windowsPath, `the pod's runAsUserName (NT AUTHORITY\SYSTEM in deploy/): a HostProcess container runs as a host account`)
}

// describedImage is an image with the descriptor its index entry gets.
type describedImage struct {
	v1.Image
	desc v1.Descriptor
}

func (d describedImage) Descriptor() (*v1.Descriptor, error) { return &d.desc, nil }

// sbomImage is an OCI 1.1 artifact: the empty config, one layer (the SBOM) and a
// subject (the image it describes).
type sbomImage struct {
	manifest []byte
	layer    v1.Layer
}

var emptyJSON = []byte("{}")

func sbomArtifact(sbom []byte, subject v1.Descriptor, created time.Time) (v1.Image, error) {
	l := static.NewLayer(sbom, sbomArtifactType)
	ld, err := partial.Descriptor(l)
	if err != nil {
		return nil, err
	}
	ld.Annotations = map[string]string{"org.opencontainers.image.title": "sbom.cdx.json"}
	subj := v1.Descriptor{MediaType: subject.MediaType, Digest: subject.Digest, Size: subject.Size}
	sum := sha256.Sum256(emptyJSON)
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  sbomArtifactType,
		Config: v1.Descriptor{
			MediaType: emptyConfigType,
			Digest:    v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)},
			Size:      int64(len(emptyJSON)),
			Data:      emptyJSON,
		},
		Layers:      []v1.Descriptor{*ld},
		Subject:     &subj,
		Annotations: map[string]string{"org.opencontainers.image.created": created.UTC().Format(time.RFC3339)},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&sbomImage{manifest: raw, layer: l})
}

func (s *sbomImage) RawConfigFile() ([]byte, error)      { return emptyJSON, nil }
func (s *sbomImage) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (s *sbomImage) RawManifest() ([]byte, error)        { return s.manifest, nil }
func (s *sbomImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if d, _ := s.layer.Digest(); d == h {
		return s.layer, nil
	}
	return nil, fmt.Errorf("blob %s not in the SBOM artifact", h)
}
