package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// The shipped tests check the image make image built (make image-check sets
// EPHEMERA_IMAGE_LAYOUT and EPHEMERA_IMAGE_BUILD_FLAGS, make image's flags).

func shipped(t *testing.T) (v1.ImageIndex, *buildConfig) {
	t.Helper()
	dir := os.Getenv("EPHEMERA_IMAGE_LAYOUT")
	if dir == "" {
		t.Skip("EPHEMERA_IMAGE_LAYOUT unset: make image-check runs this against make image's output")
	}
	args, err := shellWords(os.Getenv("EPHEMERA_IMAGE_BUILD_FLAGS"))
	if err != nil {
		t.Fatalf("EPHEMERA_IMAGE_BUILD_FLAGS: %v", err)
	}
	c, _, err := parseBuildFlags(append(args, "-out", t.TempDir()+"/oci"), 0)
	if err != nil {
		t.Fatalf("EPHEMERA_IMAGE_BUILD_FLAGS: %v", err)
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != c.Version {
		t.Fatalf("index.json: %+v, want one index named %s", m.Manifests, c.Version)
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx, c
}

// shellWords splits make's IMAGE_FLAGS as the shell does: words apart at blanks,
// single and double quotes kept together (without escapes inside; make image's
// values need none).
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0 && ch == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(ch)
		case ch == '\'' || ch == '"':
			quote, in = ch, true
		case ch == ' ' || ch == '\t' || ch == '\n':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(ch)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}

// layerFiles reads one layer into path -> entry (symlinks and files).
func layerFiles(t *testing.T, l v1.Layer) map[string]debEntry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]debEntry{}
	err = walkTar(rc, func(h *tar.Header, r io.Reader) error {
		e := debEntry{Name: strings.TrimSuffix(h.Name, "/"), Type: h.Typeflag, Mode: h.Mode, Linkname: h.Linkname}
		if h.Uid != 0 || h.Gid != 0 {
			return fmt.Errorf("%s: owner %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(r)
			if err != nil {
				return err
			}
			e.Data = b
		}
		files[e.Name] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// resolve follows symlinks inside the layer (absolute ones from its root).
func resolve(files map[string]debEntry, name string) (debEntry, bool) {
	for range 40 {
		e, ok := files[name]
		if !ok {
			// A symlinked directory on the way (e.g. lib64 -> lib)?
			dir, base := path.Split(name)
			if dir == "" {
				return debEntry{}, false
			}
			d, ok := resolve(files, strings.TrimSuffix(dir, "/"))
			if !ok || d.Type != tar.TypeDir {
				return debEntry{}, false
			}
			e, ok = files[path.Join(d.Name, base)]
			if !ok {
				return debEntry{}, false
			}
		}
		if e.Type != tar.TypeSymlink {
			return e, true
		}
		if strings.HasPrefix(e.Linkname, "/") {
			name = strings.TrimPrefix(path.Clean(e.Linkname), "/")
		} else {
			name = path.Join(path.Dir(e.Name), e.Linkname)
		}
	}
	return debEntry{}, false
}

// checkELFs: every ELF of the layer is of the platform's machine, and its interpreter
// and each DT_NEEDED resolve inside the layer (in glibc's default directories for a
// Debian multiarch system, the ones ld.so searches without an ld.so.cache).
func checkELFs(t *testing.T, arch string, files map[string]debEntry) int {
	t.Helper()
	n, problems := elfProblems(arch, files)
	for _, p := range problems {
		t.Error(p)
	}
	return n
}

func elfProblems(arch string, files map[string]debEntry) (int, []string) {
	tr := triplets[arch]
	dirs := []string{"lib/" + tr.dir, "usr/lib/" + tr.dir, "lib", "usr/lib"}
	n := 0
	var problems []string
	for name, e := range files {
		if e.Type != tar.TypeReg || !bytes.HasPrefix(e.Data, []byte("\x7fELF")) {
			continue
		}
		n++
		f, err := elf.NewFile(bytes.NewReader(e.Data))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		if f.Machine != tr.machine {
			problems = append(problems, fmt.Sprintf("%s: machine %v in the %s image", name, f.Machine, arch))
		}
		for _, p := range f.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			b, err := io.ReadAll(p.Open())
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: PT_INTERP: %v", name, err))
				continue
			}
			interp := strings.TrimPrefix(strings.TrimRight(string(b), "\x00"), "/")
			if _, ok := resolve(files, interp); !ok {
				problems = append(problems, fmt.Sprintf("%s: interpreter /%s not in the layer", name, interp))
			}
		}
		needed, err := f.DynString(elf.DT_NEEDED)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
		}
		for _, lib := range needed {
			found := false
			for _, d := range dirs {
				if l, ok := resolve(files, path.Join(d, lib)); ok && l.Type == tar.TypeReg && bytes.HasPrefix(l.Data, []byte("\x7fELF")) {
					found = true
					break
				}
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s: DT_NEEDED %s resolves nowhere in the layer (%v)", name, lib, dirs))
			}
		}
		f.Close()
	}
	return n, problems
}

func fileSHA256(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func dataSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestShippedLayout(t *testing.T) {
	idx, c := shipped(t)
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.annotations() {
		if im.Annotations[k] != v {
			t.Errorf("index annotation %s = %q, want %q", k, im.Annotations[k], v)
		}
	}
	if len(im.Manifests) != 2*len(c.Platforms) {
		t.Fatalf("%d manifests in the index, want %d (an image and an SBOM per platform)", len(im.Manifests), 2*len(c.Platforms))
	}
	images := map[string]v1.Descriptor{}
	sboms := map[string]v1.Descriptor{}
	for _, d := range im.Manifests {
		if d.Platform == nil {
			t.Fatalf("%s: no platform", d.Digest)
		}
		if d.Platform.OS == "unknown" {
			if d.Platform.Architecture != "unknown" || d.ArtifactType != sbomArtifactType {
				t.Errorf("SBOM %s: platform %+v, artifactType %q", d.Digest, d.Platform, d.ArtifactType)
			}
			sboms[d.Annotations[sbomForAnnotation]] = d
			continue
		}
		if d.Platform.OSVersion != "" {
			t.Errorf("%s: os.version %q, want none (any Windows build)", d.Digest, d.Platform.OSVersion)
		}
		images[platformString(*d.Platform)] = d
	}
	for _, p := range c.Platforms {
		ps := platformString(p)
		t.Run(strings.ReplaceAll(ps, "/", "-"), func(t *testing.T) {
			d, ok := images[ps]
			if !ok {
				t.Fatalf("no %s image", ps)
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != p.OS || cf.Architecture != p.Architecture || cf.OSVersion != "" {
				t.Errorf("config platform %s/%s os.version %q", cf.OS, cf.Architecture, cf.OSVersion)
			}
			if !cf.Created.Time.Equal(c.Epoch) {
				t.Errorf("created %v, want the commit's %v", cf.Created, c.Epoch)
			}
			for k, v := range c.annotations() {
				if cf.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
				}
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.Annotations["org.opencontainers.image.revision"] != c.Revision {
				t.Errorf("manifest annotations %v", m.Annotations)
			}
			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 2 {
				t.Fatalf("%d layers, want 2 (base, driver)", len(layers))
			}
			base, top := layerFiles(t, layers[0]), layerFiles(t, layers[1])
			bin := c.Binaries[ps]
			if bin == "" {
				bin = c.binaryPath(p) // make image's -bin-out
			}
			windowsBinary, linuxBinary := c.windowsBinary(), c.linuxBinary()
			if p.OS == "windows" {
				if cf.Config.User != "" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != windowsBinary {
					t.Errorf("config user %q entrypoint %v", cf.Config.User, cf.Config.Entrypoint)
				}
				exe, ok := top["Files/"+windowsBinary]
				if !ok {
					t.Fatalf("no Files/%s in the driver layer", windowsBinary)
				}
				if got, want := dataSHA256(exe.Data), fileSHA256(t, bin); got != want {
					t.Errorf("Files/%s sha256 %s, %s (make build-windows) %s", windowsBinary, got, bin, want)
				}
				for _, h := range hiveFiles {
					if e, ok := base["Files/Windows/System32/config/"+h]; !ok || e.Type != tar.TypeReg {
						t.Errorf("base layer without the hive file %s", h)
					}
				}
				for n := range base {
					if !strings.HasPrefix(n, "Files") {
						t.Errorf("base layer entry %s outside Files/", n)
					}
				}
			} else {
				if cf.Config.User != "0:0" || !strings.HasPrefix(cf.Config.Labels["dev.ephemera.image.user"], "root") {
					t.Errorf("config user %q, label %q: want root", cf.Config.User, cf.Config.Labels["dev.ephemera.image.user"])
				}
				drv, ok := top[linuxBinary]
				if !ok {
					t.Fatalf("no %s in the driver layer", linuxBinary)
				}
				if got, want := dataSHA256(drv.Data), fileSHA256(t, bin); got != want {
					t.Errorf("%s sha256 %s, %s %s", linuxBinary, got, bin, want)
				}
				for _, f := range []string{"sbin/mkfs.ext4", "sbin/mkfs.xfs", "sbin/debugfs", "etc/mke2fs.conf", "var/lib/dpkg/status.d/libc6"} {
					if e, ok := resolve(base, f); !ok || e.Type != tar.TypeReg {
						t.Errorf("%s: not in the base layer", f)
					}
				}
				n := checkELFs(t, p.Architecture, base)
				if m := checkELFs(t, p.Architecture, top); m != 1 {
					t.Errorf("%d ELF files in the driver layer", m)
				}
				t.Logf("%s: %d ELF files in the base layer, every DT_NEEDED inside it", ps, n)
			}
			checkSBOM(t, idx, sboms[ps], d, c, p)
		})
	}
}

func checkSBOM(t *testing.T, idx v1.ImageIndex, d, subject v1.Descriptor, c *buildConfig, p v1.Platform) {
	t.Helper()
	if d.Digest.Hex == "" {
		t.Fatal("no SBOM in the index")
	}
	art, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := art.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject == nil || m.Subject.Digest != subject.Digest || m.ArtifactType != sbomArtifactType || m.Config.MediaType != emptyConfigType {
		t.Fatalf("SBOM manifest subject %v artifactType %q config %q", m.Subject, m.ArtifactType, m.Config.MediaType)
	}
	ls, err := art.Layers()
	if err != nil || len(ls) != 1 {
		t.Fatalf("SBOM layers: %d, %v", len(ls), err)
	}
	rc, err := ls[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(rc, cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatal(err)
	}
	have := map[string]string{}
	for _, comp := range *bom.Components {
		have[comp.Name] = comp.Version
	}
	for _, mod := range []string{"github.com/ephemera-csi/ephemera", "stdlib", "google.golang.org/grpc", "github.com/container-storage-interface/spec", "go.etcd.io/bbolt"} {
		if have[mod] == "" {
			t.Errorf("SBOM: no Go module %s", mod)
		}
	}
	if p.OS == "linux" {
		closure, missing := pinnedClosure(c.Pins, p.Architecture, c.Packages)
		if len(missing) > 0 {
			t.Fatalf("the pins lack %v", missing)
		}
		for _, pn := range closure[:len(c.Packages)] {
			if have[pn.Package] != pn.Version {
				t.Errorf("SBOM: Debian package %s version %q, the pin %q", pn.Package, have[pn.Package], pn.Version)
			}
		}
	}
	t.Logf("SBOM %s: %d components", d.Digest, len(*bom.Components))
}

// TestShippedReproducible builds the index again from make image's inputs into another
// directory: the same digest, and the same bytes in every blob.
func TestShippedReproducible(t *testing.T) {
	idx, c := shipped(t)
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	res, err := build(c)
	if err != nil {
		t.Fatal(err)
	}
	if res.Index != want {
		t.Fatalf("a second build gives index %s, make image gave %s", res.Index, want)
	}
	blobs, err := filepath.Glob(filepath.Join(c.Out, "blobs", "sha256", "*"))
	if err != nil || len(blobs) == 0 {
		t.Fatalf("no blobs in %s: %v", c.Out, err)
	}
	for _, b := range blobs {
		if got := fileSHA256(t, b); got != filepath.Base(b) {
			t.Errorf("blob %s has sha256 %s", b, got)
		}
		if _, err := os.Stat(filepath.Join(os.Getenv("EPHEMERA_IMAGE_LAYOUT"), "blobs", "sha256", filepath.Base(b))); err != nil {
			t.Errorf("blob %s of the second build not in make image's layout", filepath.Base(b))
		}
	}
	t.Logf("index %s twice, %d blobs", want, len(blobs))
}

// TestShippedToolsRun runs the amd64 image's mkfs.ext4, debugfs and mkfs.xfs and its
// driver in a chroot of its layers (root; the arm64 image is checked by checkELFs only).
func TestShippedToolsRun(t *testing.T) {
	idx, c := shipped(t)
	if os.Getuid() != 0 {
		t.Skip("chroot needs root")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var img v1.Image
	for _, d := range im.Manifests {
		if d.Platform != nil && platformString(*d.Platform) == "linux/amd64" {
			img, err = idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if img == nil {
		t.Fatal("no linux/amd64 image")
	}
	root := t.TempDir()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		for name, e := range layerFiles(t, l) {
			dst := filepath.Join(root, name)
			var err error
			switch e.Type {
			case tar.TypeDir:
				err = os.MkdirAll(dst, 0o755)
			case tar.TypeReg:
				if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
					err = os.WriteFile(dst, e.Data, os.FileMode(e.Mode&0o777))
				}
			case tar.TypeSymlink:
				if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
					err = os.Symlink(e.Linkname, dst)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range []struct {
		name string
		size int64
	}{{"ext4.img", 64 << 20}, {"xfs.img", 320 << 20}} {
		fh, err := os.Create(filepath.Join(root, f.name))
		if err != nil {
			t.Fatal(err)
		}
		if err := fh.Truncate(f.size); err != nil {
			t.Fatal(err)
		}
		fh.Close()
	}
	for _, args := range [][]string{
		{"/sbin/mkfs.ext4", "-F", "-q", "/ext4.img"},
		{"/sbin/debugfs", "-R", "stats", "/ext4.img"},
		{"/sbin/mkfs.xfs", "-f", "-q", "/xfs.img"},
		{"/" + c.linuxBinary(), "version"},
	} {
		cmd := exec.Command("chroot", append([]string{root}, args...)...)
		cmd.Env = []string{linuxPath}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("chroot %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		if args[0] == "/sbin/debugfs" && !bytes.Contains(out, []byte("Filesystem magic number:  0xEF53")) {
			t.Errorf("debugfs stats of the image's mkfs.ext4 output:\n%s", out)
		}
		if args[1] == "version" && !bytes.Contains(out, []byte(c.Revision)) {
			t.Errorf("driver version output without the revision %s:\n%s", c.Revision, out)
		}
	}
}
