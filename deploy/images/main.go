// Command images builds the scratch driver's image index without a container engine:
// an OCI layout holding linux/amd64, linux/arm64 and windows/amd64 (HostProcess) images,
// each with a CycloneDX SBOM, reproducible from one commit (docs/operations.md, "The
// image"). It is its own module so that go-containerregistry, cyclonedx-go and xz stay
// out of the framework's dependencies.
//
//	go run . build -pins debian.pins -out DIR -bin linux/amd64=FILE -bin linux/arm64=FILE -bin windows/amd64=FILE ...
//	go run . pins -pins debian.pins
//	go run . push -layout DIR -to REPOSITORY:TAG
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = runBuild(os.Args[2:])
	case "pins":
		err = runPins(os.Args[2:])
	case "push":
		err = runPush(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: images build|pins|push [flags] (-h for the flags)")
	os.Exit(2)
}

type binFlag map[string]string

func (b binFlag) String() string { return fmt.Sprint(map[string]string(b)) }
func (b binFlag) Set(v string) error {
	p, f, ok := strings.Cut(v, "=")
	if !ok || f == "" {
		return errors.New("want PLATFORM=FILE, e.g. linux/arm64=_output/bin/linux-arm64/ephemera-scratch")
	}
	b[p] = f
	return nil
}

var httpClient = &http.Client{Timeout: 5 * time.Minute}

func runBuild(args []string) error {
	c, digestFile, err := parseBuildFlags(args, flag.ExitOnError)
	if err != nil {
		return err
	}
	res, err := build(c)
	if err != nil {
		return err
	}
	fmt.Printf("image index %s (OCI layout %s, tag %s)\n", res.Index, c.Out, c.Version)
	for _, pr := range res.Platforms {
		fmt.Printf("  %-14s %s  SBOM: manifest %s in the index (platform unknown/unknown, subject %.19s…), file %s\n",
			pr.Platform, pr.Manifest, pr.SBOM, pr.Manifest, pr.SBOMFile)
	}
	if digestFile != "" {
		return os.WriteFile(digestFile, []byte(res.Index.String()+"\n"), 0o644)
	}
	return nil
}

// parseBuildFlags makes the build's configuration from its command line (also the
// tests', which build again from make image's flags).
func parseBuildFlags(args []string, onError flag.ErrorHandling) (*buildConfig, string, error) {
	fs := flag.NewFlagSet("build", onError)
	pins := fs.String("pins", "debian.pins", "the pins file")
	mirror := fs.String("mirror", "http://deb.debian.org/debian", "the Debian mirror the pinned .debs are fetched from (pool/ below it)")
	cache := fs.String("cache", "", "the directory of fetched .debs (required)")
	out := fs.String("out", "", "the OCI layout directory to write (made anew; the SBOMs go to DIR.sbom/)")
	version := fs.String("version", "", "org.opencontainers.image.version")
	revision := fs.String("revision", "", "org.opencontainers.image.revision (the commit)")
	source := fs.String("source", "https://github.com/ephemera-csi/ephemera", "org.opencontainers.image.source")
	epoch := fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every timestamp of the images, in seconds (the commit's time)")
	digestFile := fs.String("digest-file", "", "also write the index digest to this file")
	bins := binFlag{}
	fs.Var(bins, "bin", "PLATFORM=FILE: the driver binary of a platform (once per platform)")
	if err := fs.Parse(args); err != nil {
		return nil, "", err
	}
	if *out == "" || *cache == "" {
		return nil, "", errors.New("build: -out and -cache are required")
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("build: SOURCE_DATE_EPOCH %q: want seconds since 1970 (git log -1 --format=%%ct)", *epoch)
	}
	p, err := readPins(*pins)
	if err != nil {
		return nil, "", err
	}
	return &buildConfig{
		Pins: p, Mirror: *mirror, Cache: *cache, Client: httpClient, Binaries: bins,
		Version: *version, Revision: *revision, Source: *source, Epoch: time.Unix(secs, 0).UTC(), Out: *out,
	}, *digestFile, nil
}

func runPins(args []string) error {
	fs := flag.NewFlagSet("pins", flag.ExitOnError)
	pinsFile := fs.String("pins", "debian.pins", "the pins file to write")
	mirror := fs.String("mirror", "http://deb.debian.org/debian", "the Debian mirror (bookworm, bookworm-updates)")
	security := fs.String("security-mirror", "http://deb.debian.org/debian-security", "the Debian security mirror (bookworm-security)")
	keyring := fs.String("keyring", debianKeyring, "the keyring gpgv checks InRelease against")
	_ = fs.Parse(args)
	suites := []suite{
		{mirror: strings.TrimSuffix(*mirror, "/"), name: "bookworm"},
		{mirror: strings.TrimSuffix(*mirror, "/"), name: "bookworm-updates"},
		{mirror: strings.TrimSuffix(*security, "/"), name: "bookworm-security"},
	}
	pins, err := refreshPins(httpClient, suites, []string{"amd64", "arm64"}, debPackageNames(), *keyring)
	if err != nil {
		return err
	}
	old, _ := readPins(*pinsFile)
	if err := writePins(*pinsFile, pins); err != nil {
		return err
	}
	changed := 0
	for _, p := range pins {
		if o, ok := findPin(old, p.Arch, p.Package); !ok || o.Version != p.Version || o.SHA256 != p.SHA256 {
			fmt.Printf("  %s %s %s\n", p.Arch, p.Package, p.Version)
			changed++
		}
	}
	fmt.Printf("%s: %d pins, %d changed\n", *pinsFile, len(pins), changed)
	return nil
}
