// Command images builds a driver's image index without a container engine: an OCI
// layout holding linux/amd64, linux/arm64 and windows/amd64 (HostProcess) images, each
// with a CycloneDX SBOM, reproducible from one commit (docs/authors.md and
// docs/operations.md, "The image"). It builds the driver itself, from the module in
// the current directory, and carries the Debian packages it needs with their
// libraries, resolved from a pinned Packages index. make image is one caller (the
// scratch driver); a driver author runs it from their module:
//
//	go run github.com/ephemera-csi/ephemera/deploy/images@VERSION build -main . -name my-driver \
//	    -packages e2fsprogs,xfsprogs -platforms linux/amd64,linux/arm64 -out _output/image \
//	    [-archive my-driver.oci.tar] [-version V] [-revision COMMIT] [-source-date-epoch SECONDS]
//	go run . pins -pins debian.pins -packages e2fsprogs,xfsprogs
//	go run . push -layout DIR -to REPOSITORY:TAG
//
// It is its own module so that go-containerregistry, cyclonedx-go and xz stay out of
// the framework's dependencies.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	ref "github.com/google/go-containerregistry/pkg/name"
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
	fmt.Fprintln(os.Stderr, "usage: images build|pins|push [flags] (images build -h for the flags)")
	os.Exit(2)
}

type binFlag map[string]string

func (b binFlag) String() string { return fmt.Sprint(map[string]string(b)) }
func (b binFlag) Set(v string) error {
	p, f, ok := strings.Cut(v, "=")
	if !ok || f == "" {
		return errors.New("want PLATFORM=FILE, e.g. linux/arm64=_output/bin/linux-arm64/my-driver")
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
	c.Log = os.Stderr
	if c.tempBinOut {
		defer os.RemoveAll(c.BinOut)
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
	if c.Archive != "" {
		fmt.Printf("  OCI archive %s\n", c.Archive)
	}
	if digestFile != "" {
		return os.WriteFile(digestFile, []byte(res.Index.String()+"\n"), 0o644)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// gitOut is a git command's output in dir, trimmed ("" if git fails: no repository).
func gitOut(dir string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func defaultCache() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "ephemera-image", "debs")
	}
	return ""
}

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

const defaultPlatforms = "linux/amd64,linux/arm64,windows/amd64"

// parseBuildFlags makes the build's configuration from its command line (also the
// tests', which build again from make image's flags).
func parseBuildFlags(args []string, onError flag.ErrorHandling) (*buildConfig, string, error) {
	fs := flag.NewFlagSet("build", onError)
	mainPkg := fs.String("main", "", "the driver's main package, as go build takes it (e.g. . or ./cmd/my-driver), of the module in -dir")
	dir := fs.String("dir", ".", "the driver's module directory: go build, git and the default -pins run there")
	name := fs.String("name", "", "the driver's name: its binary's (/usr/local/bin/NAME, Files/NAME.exe: the entrypoint) and the image's title (required)")
	description := fs.String("description", "", "org.opencontainers.image.description (default: \"NAME: ephemeral inline CSI volumes (an Ephemera driver)\")")
	licenses := fs.String("licenses", "", "org.opencontainers.image.licenses, an SPDX expression (none if empty)")
	packages := fs.String("packages", "", "comma-separated Debian packages the Linux images carry (e.g. e2fsprogs,xfsprogs): their closure is resolved from -pins, and with them the libraries their programs load")
	files := fs.String("files", "", "comma-separated files of -packages to carry (e.g. /sbin/mkfs.ext4,/sbin/mkfs.xfs) instead of all their files but documentation")
	plats := fs.String("platforms", "", "comma-separated platforms of the index, of "+defaultPlatforms+" (default all three, windows/amd64 only if the driver builds for Windows)")
	tags := fs.String("tags", "", "go build -tags")
	ldflags := fs.String("ldflags", "", "go build -ldflags")
	binOut := fs.String("bin-out", "", "where the driver binaries are built, as DIR/OS-ARCH/NAME[.exe] (default a temporary directory)")
	pins := fs.String("pins", "", "the pins file of the Debian packages (default DIR/debian.pins; written when it lacks a package of the closure)")
	offline := fs.Bool("offline", false, "never fetch a Packages index: fail if -pins lacks a package of the closure")
	mirror := fs.String("mirror", "http://deb.debian.org/debian", "the Debian mirror the pinned .debs (pool/ below it) and the bookworm and bookworm-updates indexes are fetched from")
	security := fs.String("security-mirror", "http://deb.debian.org/debian-security", "the Debian security mirror: bookworm-security's index and .debs (pool/updates/)")
	keyring := fs.String("keyring", debianKeyring, "the keyring gpgv checks InRelease against")
	cache := fs.String("cache", defaultCache(), "the directory of fetched .debs")
	out := fs.String("out", "", "the OCI layout directory to write (made anew; the SBOMs go to DIR.sbom/) (required)")
	archive := fs.String("archive", "", "also write the layout as this tar (an OCI archive: skopeo oci-archive:, ctr images import)")
	repository := fs.String("repository", "", "the image's repository (e.g. registry.example.com/my-driver): the -archive then names the index REPOSITORY:VERSION and REPOSITORY@DIGEST, so `ctr images import` creates both names without --base-name (a pod naming REPOSITORY:VERSION@DIGEST finds it without a pull)")
	version := fs.String("version", "", "org.opencontainers.image.version and the layout's tag (default git describe --tags --always --dirty)")
	revision := fs.String("revision", "", "org.opencontainers.image.revision (default the commit, git rev-parse HEAD)")
	source := fs.String("source", "", "org.opencontainers.image.source (none if empty)")
	epoch := fs.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every timestamp of the images, in seconds (default $SOURCE_DATE_EPOCH, else the commit's time)")
	digestFile := fs.String("digest-file", "", "also write the index digest to this file")
	bins := binFlag{}
	fs.Var(bins, "bin", "PLATFORM=FILE: a driver binary built already for a platform, instead of building -main for it")
	if err := fs.Parse(args); err != nil {
		return nil, "", err
	}
	if fs.NArg() > 0 {
		return nil, "", fmt.Errorf("build: unexpected arguments %q (flags only)", fs.Args())
	}
	if *out == "" || *name == "" {
		return nil, "", errors.New("build: -name and -out are required")
	}
	if *cache == "" {
		return nil, "", errors.New("build: no user cache directory: give -cache")
	}
	if !validName.MatchString(*name) {
		return nil, "", fmt.Errorf("build: -name %q: want letters, digits, '.', '_' and '-' (it names the binary and the image)", *name)
	}
	if *files != "" && *packages == "" {
		return nil, "", errors.New("build: -files picks files of -packages: name the packages too")
	}
	if *version == "" {
		*version = gitOut(*dir, "describe", "--tags", "--always", "--dirty")
	}
	if *revision == "" {
		*revision = gitOut(*dir, "rev-parse", "HEAD")
	}
	if *version == "" || *revision == "" {
		return nil, "", errors.New("build: -version and -revision are required outside a git repository")
	}
	if *epoch == "" {
		*epoch = gitOut(*dir, "log", "-1", "--format=%ct")
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("build: SOURCE_DATE_EPOCH %q: want seconds since 1970 (git log -1 --format=%%ct)", *epoch)
	}
	if *repository != "" {
		if *archive == "" {
			return nil, "", errors.New("build: -repository names the image in the -archive: give -archive too")
		}
		last := (*repository)[strings.LastIndex(*repository, "/")+1:]
		if _, err := ref.NewRepository(*repository); err != nil || strings.ContainsAny(last, ":@") || strings.Contains(*repository, "@") {
			return nil, "", fmt.Errorf("build: -repository %q: want a repository without tag or digest, like registry.example.com/my-driver", *repository)
		}
	}
	if *description == "" {
		*description = *name + ": ephemeral inline CSI volumes (an Ephemera driver)"
	}
	c := &buildConfig{
		Name: *name, Description: *description, Licenses: *licenses,
		Dir: *dir, Main: *mainPkg, Tags: *tags, Ldflags: *ldflags, BinOut: *binOut, Binaries: bins,
		Packages: splitList(*packages), Files: splitList(*files),
		Offline: *offline, Keyring: *keyring, Mirror: *mirror, SecurityMirror: *security, Cache: *cache, Client: httpClient,
		Suites:  debianSuites(*mirror, *security),
		Version: *version, Revision: *revision, Source: *source, Epoch: time.Unix(secs, 0).UTC(), Out: *out, Archive: *archive, Repository: *repository,
	}
	explicit := *plats != ""
	if !explicit {
		*plats = defaultPlatforms
	}
	for _, ps := range splitList(*plats) {
		found := false
		for _, p := range platforms {
			if platformString(p) == ps {
				c.Platforms = append(c.Platforms, p)
				found = true
			}
		}
		if !found {
			return nil, "", fmt.Errorf("build: -platforms %s: want some of %s", ps, defaultPlatforms)
		}
	}
	c.OptionalWindows = !explicit
	if c.BinOut == "" {
		d, err := os.MkdirTemp("", "ephemera-images-bin-")
		if err != nil {
			return nil, "", err
		}
		c.BinOut, c.tempBinOut = d, true
	}
	c.PinsFile = *pins
	if c.PinsFile == "" {
		c.PinsFile = filepath.Join(*dir, "debian.pins")
	}
	if len(c.Packages) > 0 {
		p, err := readPins(c.PinsFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, "", err
		}
		c.Pins = p
	}
	return c, *digestFile, nil
}

func debianSuites(mirror, security string) []suite {
	mirror, security = strings.TrimSuffix(mirror, "/"), strings.TrimSuffix(security, "/")
	return []suite{{mirror: mirror, name: "bookworm"}, {mirror: mirror, name: "bookworm-updates"}, {mirror: security, name: "bookworm-security"}}
}

// runPins pins the newest versions of the closure of -packages (every pin before
// replaced): make image-pins, or an author refreshing theirs.
func runPins(args []string) error {
	fs := flag.NewFlagSet("pins", flag.ExitOnError)
	pinsFile := fs.String("pins", "debian.pins", "the pins file to write")
	packages := fs.String("packages", "", "comma-separated Debian packages whose closure to pin (required)")
	arches := fs.String("arches", "amd64,arm64", "comma-separated Debian architectures")
	mirror := fs.String("mirror", "http://deb.debian.org/debian", "the Debian mirror (bookworm, bookworm-updates)")
	security := fs.String("security-mirror", "http://deb.debian.org/debian-security", "the Debian security mirror (bookworm-security)")
	keyring := fs.String("keyring", debianKeyring, "the keyring gpgv checks InRelease against")
	_ = fs.Parse(args)
	if *packages == "" {
		return errors.New("pins: -packages is required (e.g. -packages e2fsprogs,xfsprogs)")
	}
	pins, err := resolvePins(httpClient, debianSuites(*mirror, *security), splitList(*arches), splitList(*packages), *keyring)
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
