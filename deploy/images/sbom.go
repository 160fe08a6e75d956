package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"fmt"
	"net/url"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// makeSBOM writes the CycloneDX SBOM of one platform's image: the driver's Go modules
// as its build info names them (debug/buildinfo: the main module, every dependency with
// its go.sum hash, the Go toolchain and the build settings) and, on Linux, the Debian
// packages whose files the image carries (with the sha256 of each .deb). The document
// depends only on its inputs: no wall clock, a serial number derived from them.
func makeSBOM(c *buildConfig, p v1.Platform, bin string, debs []pin) ([]byte, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	if info.Main.Path == "" {
		return nil, fmt.Errorf("%s: no main module in its build info", bin)
	}
	var goos, goarch string
	var props []cdx.Property
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
		props = append(props, cdx.Property{Name: "golang:build:" + s.Key, Value: s.Value})
	}
	if goos != p.OS || goarch != p.Architecture {
		return nil, fmt.Errorf("%s: built for %s/%s, not %s", bin, goos, goarch, platformString(p))
	}

	root := "pkg:oci/" + url.PathEscape(c.Name) + "@" + url.PathEscape(c.Version) + "?platform=" + url.QueryEscape(platformString(p))
	mainRef := goPURL(info.Main.Path, c.Version)
	comps := []cdx.Component{{
		BOMRef:     mainRef,
		Type:       cdx.ComponentTypeApplication,
		Name:       info.Main.Path,
		Version:    c.Version,
		PackageURL: mainRef,
		Properties: &[]cdx.Property{{Name: "golang:module:version", Value: info.Main.Version}, {Name: "vcs:revision", Value: c.Revision}},
	}}
	if c.Source != "" {
		comps[0].ExternalReferences = &[]cdx.ExternalReference{{Type: cdx.ERTypeVCS, URL: c.Source}}
	}
	stdRef := goPURL("stdlib", info.GoVersion)
	comps = append(comps, cdx.Component{
		BOMRef: stdRef, Type: cdx.ComponentTypeLibrary, Name: "stdlib", Version: info.GoVersion, PackageURL: stdRef,
		Description: "the Go standard library and runtime linked into the driver",
	})
	deps := []string{stdRef}
	for _, m := range info.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		ref := goPURL(m.Path, m.Version)
		comp := cdx.Component{BOMRef: ref, Type: cdx.ComponentTypeLibrary, Name: m.Path, Version: m.Version, PackageURL: ref}
		if m.Sum != "" {
			comp.Properties = &[]cdx.Property{{Name: "golang:module:sum", Value: m.Sum}}
		}
		comps = append(comps, comp)
		deps = append(deps, ref)
	}
	var debRefs []string
	for _, d := range debs {
		ref := "pkg:deb/debian/" + d.Package + "@" + url.PathEscape(d.Version) + "?arch=" + d.Arch + "&distro=debian-12"
		comps = append(comps, cdx.Component{
			BOMRef: ref, Type: cdx.ComponentTypeLibrary, Name: d.Package, Version: d.Version, PackageURL: ref,
			Supplier: &cdx.OrganizationalEntity{Name: "Debian"},
			Hashes:   &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: d.SHA256}},
			ExternalReferences: &[]cdx.ExternalReference{{
				Type: cdx.ERTypeDistribution, URL: strings.TrimSuffix(c.mirrorOf(d), "/") + "/" + d.Filename,
			}},
		})
		debRefs = append(debRefs, ref)
	}

	bom := cdx.NewBOM()
	bom.SerialNumber = serial(root, c.Revision)
	bom.Metadata = &cdx.Metadata{
		Timestamp: c.Epoch.UTC().Format(time.RFC3339),
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "ephemera deploy/images", Version: c.Version,
			Description: "make image: go-containerregistry and cyclonedx-go",
		}}},
		Component: &cdx.Component{
			BOMRef:      root,
			Type:        cdx.ComponentTypeContainer,
			Name:        c.Name,
			Version:     c.Version,
			PackageURL:  root,
			Description: "the " + platformString(p) + " image of " + c.Name,
		},
		Properties: &props,
	}
	bom.Components = &comps
	top := append([]string{mainRef}, debRefs...)
	bom.Dependencies = &[]cdx.Dependency{
		{Ref: root, Dependencies: &top},
		{Ref: mainRef, Dependencies: &deps},
	}
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.Encode(bom); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func goPURL(path, version string) string {
	return "pkg:golang/" + path + "@" + url.PathEscape(version)
}

// serial is a urn:uuid from the SBOM's identity (a name-based UUID, version 5 layout).
func serial(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
