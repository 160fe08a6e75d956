package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestBinariesWindowsOptional builds a module whose driver does not build for
// Windows: windows/amd64 is left out, said so, when the platforms were the default,
// and fails the build when they named it.
func TestBinariesWindowsOptional(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	mod := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":  "module example.com/linuxonly\n\ngo 1.22\n",
		"main.go": "//go:build linux\n\npackage main\n\nfunc main() {}\n",
	} {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var log bytes.Buffer
	c := &buildConfig{
		Name: "linuxonly", Dir: mod, Main: ".", BinOut: t.TempDir(), Log: &log,
		Platforms:       []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "windows", Architecture: "amd64"}},
		OptionalWindows: true,
	}
	t.Setenv("GOFLAGS", "-mod=mod")
	t.Setenv("GOWORK", "off")
	bins, plats, err := c.binaries()
	if err != nil {
		t.Fatal(err)
	}
	if len(plats) != 1 || platformString(plats[0]) != "linux/amd64" || bins["linux/amd64"] != filepath.Join(c.BinOut, "linux-amd64", "linuxonly") {
		t.Fatalf("platforms %v, binaries %v", plats, bins)
	}
	if _, err := os.Stat(bins["linux/amd64"]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "windows/amd64: the driver does not build for Windows, so the index has no windows/amd64 image") {
		t.Errorf("log:\n%s", log.String())
	}
	c.OptionalWindows = false
	if _, _, err := c.binaries(); err == nil || !strings.Contains(err.Error(), "go build . for windows/amd64") {
		t.Errorf("windows/amd64 asked for: %v", err)
	}
}

// TestWriteArchive: the OCI archive holds the layout's files, sorted, at the epoch.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"oci-layout": "{}", "index.json": "{}", "blobs/sha256/ab": "x"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "a.tar")
	epoch := time.Unix(1700000000, 0).UTC()
	if err := writeArchive(dir, file, epoch, nil); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	err = walkTar(f, func(h *tar.Header, r io.Reader) error {
		if !h.ModTime.Equal(epoch) || h.Uid != 0 {
			t.Errorf("%s: mtime %v uid %d", h.Name, h.ModTime, h.Uid)
		}
		names = append(names, h.Name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names, " "); got != "blobs/ blobs/sha256/ blobs/sha256/ab index.json oci-layout" {
		t.Errorf("archive entries %s", got)
	}
}

// TestNamedArchive: with a repository the archive's index.json names the
// image index REPO:VERSION (tagged VERSION) and REPO@DIGEST, what `ctr images
// import` names images from; the layout's own index.json keeps its one
// descriptor, the other files are the layout's.
func TestNamedArchive(t *testing.T) {
	dir := t.TempDir()
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	layoutIndex := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","size":1234,"digest":"` + digest + `","annotations":{"org.opencontainers.image.ref.name":"v0.1.0"}}]}`
	for name, body := range map[string]string{"oci-layout": "{}", "index.json": layoutIndex, "blobs/sha256/ab": "x"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	index, err := namedIndex(dir, "registry.example.com/whoami", "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "a.tar")
	if err := writeArchive(dir, file, time.Unix(1700000000, 0).UTC(), index); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string]string{}
	err = walkTar(f, func(h *tar.Header, r io.Reader) error {
		b, err := io.ReadAll(r)
		files[h.Name] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var got v1.IndexManifest
	if err := json.Unmarshal([]byte(files["index.json"]), &got); err != nil {
		t.Fatalf("the archive's index.json: %v", err)
	}
	want := []map[string]string{
		{"io.containerd.image.name": "registry.example.com/whoami:v0.1.0", "org.opencontainers.image.ref.name": "v0.1.0"},
		{"io.containerd.image.name": "registry.example.com/whoami@" + digest},
	}
	if len(got.Manifests) != 2 {
		t.Fatalf("the archive's index.json: %s, want two descriptors", files["index.json"])
	}
	for i, d := range got.Manifests {
		if d.Digest.String() != digest || d.Size != 1234 || d.MediaType != "application/vnd.oci.image.index.v1+json" || !maps.Equal(d.Annotations, want[i]) {
			t.Errorf("descriptor %d: %+v, want the index %s with %v", i, d, digest, want[i])
		}
	}
	if files["blobs/sha256/ab"] != "x" || files["oci-layout"] != "{}" {
		t.Errorf("the layout's other files: %q", files)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "index.json")); err != nil || string(b) != layoutIndex {
		t.Errorf("the layout's index.json changed: %s, %v", b, err)
	}
	if _, err := namedIndex(t.TempDir(), "registry.example.com/whoami", "v0.1.0"); err == nil {
		t.Error("a directory without index.json: no error")
	}
}

// TestParseBuildFlags: the contract's flags, their defaults and refusals.
func TestParseBuildFlags(t *testing.T) {
	base := []string{"-name", "whoami", "-out", t.TempDir() + "/oci", "-version", "v1", "-revision", "abc", "-source-date-epoch", "1700000000", "-cache", t.TempDir()}
	c, _, err := parseBuildFlags(append(base, "-main", ".", "-packages", "e2fsprogs, xfsprogs", "-pins", filepath.Join(t.TempDir(), "none.pins")), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Platforms) != 3 || !c.OptionalWindows || strings.Join(c.Packages, " ") != "e2fsprogs xfsprogs" || c.Pins != nil {
		t.Errorf("defaults: platforms %v optional windows %v packages %q pins %v", c.Platforms, c.OptionalWindows, c.Packages, c.Pins)
	}
	if c.linuxBinary() != "usr/local/bin/whoami" || c.windowsBinary() != "whoami.exe" || c.annotations()["org.opencontainers.image.title"] != "whoami" {
		t.Errorf("names: %s %s %v", c.linuxBinary(), c.windowsBinary(), c.annotations())
	}
	if _, ok := c.annotations()["org.opencontainers.image.source"]; ok {
		t.Error("an empty -source annotated")
	}
	os.RemoveAll(c.BinOut)
	c, _, err = parseBuildFlags(append(base, "-platforms", "linux/arm64,windows/amd64"), 0)
	if err != nil || len(c.Platforms) != 2 || c.OptionalWindows {
		t.Errorf("explicit platforms: %+v, %v", c, err)
	}
	os.RemoveAll(c.BinOut)
	c, _, err = parseBuildFlags(append(base, "-archive", "a.tar", "-repository", "localhost:5000/team/whoami"), 0)
	if err != nil || c.Repository != "localhost:5000/team/whoami" {
		t.Errorf("-repository with a registry port: %+v, %v", c, err)
	} else {
		os.RemoveAll(c.BinOut)
	}
	for _, bad := range [][]string{
		{"-platforms", "linux/s390x"},
		{"-name", "my driver"},
		{"-files", "/sbin/mkfs.xfs"},
		{"-source-date-epoch", "yesterday"},
		{"-repository", "registry.example.com/x", "-archive", ""},
		{"-repository", "registry.example.com/x:v1", "-archive", "a.tar"},
		{"-repository", "registry.example.com/x@sha256:" + strings.Repeat("0", 64), "-archive", "a.tar"},
		{"-repository", "Registry.example.com/My_Driver", "-archive", "a.tar"},
	} {
		if _, _, err := parseBuildFlags(append(append([]string(nil), base...), bad...), 0); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestMirrorOf: a bookworm-security .deb (pool/updates/) comes from the security mirror.
func TestMirrorOf(t *testing.T) {
	c := &buildConfig{Mirror: "http://m/debian", SecurityMirror: "http://m/debian-security"}
	if got := c.mirrorOf(pin{Filename: "pool/updates/main/x/xz-utils/liblzma5_5.4.1-1+deb12u2_amd64.deb"}); got != c.SecurityMirror {
		t.Errorf("security .deb from %s", got)
	}
	if got := c.mirrorOf(pin{Filename: "pool/main/g/glibc/libc6_2.36-9+deb12u14_amd64.deb"}); got != c.Mirror {
		t.Errorf("main .deb from %s", got)
	}
}
