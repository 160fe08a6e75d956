//go:build e2e && linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Releases of the driver for the upgrade scenarios: the binary, make image's OCI
// index and the rendered shipped manifests of one commit, built from this
// clone's history with make image's steps (build-static, build-static-arm64,
// build-windows, deploy/images build) and test/manifests' renderer.

// upgradeFromFile names the commit the upgrade scenarios start from (see the
// file for why that one).
const upgradeFromFile = "test/e2e/upgrade-from"

// releaseTarget is the render target whose manifests a release installs.
const releaseTarget = "kustomize-linux-embedded-registrar"

// driverRelease is one commit's driver, built as make image builds it.
type driverRelease struct {
	commit    string       // full hash; "" for the working tree
	version   string       // what the binary's version subcommand prints first
	img       shippedImage // the OCI layout and its index digest
	manifests string       // releaseTarget rendered by that commit's test/manifests
}

// readUpgradeFrom returns the commit test/e2e/upgrade-from names: its only
// line that is neither empty nor a comment.
func readUpgradeFrom(repoRoot string) (string, error) {
	f, err := os.Open(filepath.Join(repoRoot, upgradeFromFile))
	if err != nil {
		return "", err
	}
	defer f.Close()
	var commits []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		commits = append(commits, l)
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if len(commits) != 1 || len(commits[0]) != 40 || strings.Trim(commits[0], "0123456789abcdef") != "" {
		return "", fmt.Errorf("%s: want one full commit hash (40 hex digits) besides comments, got %q", upgradeFromFile, commits)
	}
	return commits[0], nil
}

var (
	upgradeFromOnce sync.Once
	upgradeFromRel  driverRelease
	upgradeFromErr  error
	currentOnce     sync.Once
	currentRel      driverRelease
	currentErr      error
)

// upgradeFromImage returns the release of test/e2e/upgrade-from's commit,
// built once per machine into ${EPHEMERA_E2E_CACHE}/upgrade-from-<commit>-<go
// version>/ (one build at a time, by flock on <dir>.lock). The commit must be in
// this clone: a shallow clone fails the test with the command that fetches it.
func upgradeFromImage(t *testing.T) driverRelease {
	t.Helper()
	upgradeFromOnce.Do(func() {
		upgradeFromRel, upgradeFromErr = clu.buildUpgradeFrom(context.Background())
	})
	if upgradeFromErr != nil {
		t.Fatalf("the release to upgrade from (%s): %v", upgradeFromFile, upgradeFromErr)
	}
	return upgradeFromRel
}

// currentImage returns the working tree's release, built once per run into
// the run root (make image's index when make e2e already built it:
// EPHEMERA_E2E_IMAGE_LAYOUT with its digest file present; it is not waited for).
func currentImage(t *testing.T) driverRelease {
	t.Helper()
	currentOnce.Do(func() {
		currentRel, currentErr = clu.buildCurrent(context.Background())
	})
	if currentErr != nil {
		t.Fatalf("the working tree's release: %v", currentErr)
	}
	return currentRel
}

func (c *cluster) buildUpgradeFrom(ctx context.Context) (driverRelease, error) {
	commit, err := readUpgradeFrom(c.repoRoot)
	if err != nil {
		return driverRelease{}, err
	}
	if out, err := c.git(ctx, "cat-file", "-e", commit+"^{commit}"); err != nil {
		shallow, _ := c.git(ctx, "rev-parse", "--is-shallow-repository")
		return driverRelease{}, fmt.Errorf("commit %s (%s) is not in this clone (%s; shallow: %s): fetch it with "+
			"`git fetch --unshallow origin` (or `git fetch origin %s`) and run again", commit, upgradeFromFile,
			strings.TrimSpace(out), strings.TrimSpace(shallow), commit)
	}
	cache := os.Getenv("EPHEMERA_E2E_CACHE")
	if cache == "" {
		cache = "/var/cache/ephemera-e2e"
	}
	dir := filepath.Join(cache, fmt.Sprintf("upgrade-from-%s-%s", commit[:12], runtime.Version()))
	rel := driverRelease{
		commit: commit, version: commit[:7],
		img:       shippedImage{layout: filepath.Join(dir, "image")},
		manifests: filepath.Join(dir, "manifests", releaseTarget+".yaml"),
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return rel, err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return rel, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return rel, fmt.Errorf("flock %s: %w", lock.Name(), err)
	}
	complete := filepath.Join(dir, "complete")
	if b, err := os.ReadFile(complete); err == nil && strings.TrimSpace(string(b)) == commit {
		return rel, rel.readDigest()
	}
	t0 := time.Now()
	if err := os.RemoveAll(dir); err != nil {
		return rel, err
	}
	tmp, err := os.MkdirTemp(cache, ".upgrade-from-")
	if err != nil {
		return rel, err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return rel, err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", c.repoRoot, commit, src)
	if b, err := archive.CombinedOutput(); err != nil {
		return rel, fmt.Errorf("git archive %s: %v\n%s", commit, err, b)
	}
	epoch, err := c.git(ctx, "log", "-1", "--format=%ct", commit)
	if err != nil {
		return rel, fmt.Errorf("git log %s: %v", commit, err)
	}
	built := filepath.Join(tmp, "out")
	if err := buildRelease(ctx, src, built, rel.version, commit, strings.TrimSpace(epoch)); err != nil {
		return rel, fmt.Errorf("build %s: %w", commit, err)
	}
	if err := os.Rename(built, dir); err != nil {
		return rel, err
	}
	if err := os.WriteFile(complete, []byte(commit+"\n"), 0o644); err != nil {
		return rel, err
	}
	c.step("release "+commit[:12]+" built from the clone's history (cached in "+dir+")", t0)
	return rel, rel.readDigest()
}

func (c *cluster) buildCurrent(ctx context.Context) (driverRelease, error) {
	version, err := c.git(ctx, "describe", "--tags", "--always", "--dirty")
	if err != nil {
		return driverRelease{}, fmt.Errorf("git describe: %v", err)
	}
	commit, err := c.git(ctx, "rev-parse", "HEAD")
	if err != nil {
		return driverRelease{}, fmt.Errorf("git rev-parse: %v", err)
	}
	epoch, err := c.git(ctx, "log", "-1", "--format=%ct")
	if err != nil {
		return driverRelease{}, fmt.Errorf("git log: %v", err)
	}
	t0 := time.Now()
	out := filepath.Join(c.root, "release-current")
	rel := driverRelease{version: strings.TrimSpace(version)}
	if layout := os.Getenv("EPHEMERA_E2E_IMAGE_LAYOUT"); layout != "" {
		if _, err := os.Stat(layout + ".digest"); err == nil {
			rel.img = shippedImage{layout: layout}
			// make image names the index by the version its binaries got.
			if rel.version, err = layoutVersion(layout); err != nil {
				return rel, err
			}
		}
	}
	if rel.img.layout == "" {
		if err := buildRelease(ctx, c.repoRoot, out, rel.version, strings.TrimSpace(commit), strings.TrimSpace(epoch)); err != nil {
			return rel, err
		}
		rel.img = shippedImage{layout: filepath.Join(out, "image")}
		rel.manifests = filepath.Join(out, "manifests", releaseTarget+".yaml")
	} else if err := renderTarget(ctx, c.repoRoot, filepath.Join(out, "manifests")); err != nil {
		return rel, err
	} else {
		rel.manifests = filepath.Join(out, "manifests", releaseTarget+".yaml")
	}
	c.step("the working tree's release built ("+rel.version+")", t0)
	return rel, rel.readDigest()
}

// layoutVersion is the version make image gave an OCI layout's index (the
// annotation org.opencontainers.image.ref.name in its index.json).
func layoutVersion(layout string) (string, error) {
	b, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		return "", err
	}
	var idx struct {
		Manifests []struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return "", fmt.Errorf("%s/index.json: %w", layout, err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"] == "" {
		return "", fmt.Errorf("%s/index.json: want one index named by org.opencontainers.image.ref.name", layout)
	}
	return idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"], nil
}

func (r *driverRelease) readDigest() error {
	b, err := os.ReadFile(r.img.layout + ".digest")
	if err != nil {
		return err
	}
	r.img.digest = strings.TrimSpace(string(b))
	if !strings.HasPrefix(r.img.digest, "sha256:") {
		return fmt.Errorf("%s.digest: %q is not a digest", r.img.layout, r.img.digest)
	}
	return nil
}

// git runs git in the repository and returns its standard output.
func (c *cluster) git(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = c.repoRoot
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return stderr.String(), fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// buildRelease does in the source tree src what make image and make manifests
// do, with the flags of that tree's Makefile (build-static, build-static-arm64,
// build-windows: CGO_ENABLED=0 -trimpath -tags grpcnotrace, -s -w and the version
// ldflags; then deploy/images build with debian.pins and the .debs cached in
// IMAGE_CACHE), and writes into out: ephemera-scratch (linux/amd64), image/ and
// image.digest, manifests/<releaseTarget>.yaml.
func buildRelease(ctx context.Context, src, out, version, commit, epoch string) error {
	bins := filepath.Join(out, "bin")
	ldflags := fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s", version, commit)
	tags := os.Getenv("EPHEMERA_GOTAGS")
	if tags == "" {
		tags = "grpcnotrace"
	}
	platforms := []struct{ goos, goarch, file string }{
		{"linux", "amd64", "linux-amd64/ephemera-scratch"},
		{"linux", "arm64", "linux-arm64/ephemera-scratch"},
		{"windows", "amd64", "windows-amd64/ephemera-scratch.exe"},
	}
	var imageBins []string
	for _, p := range platforms {
		f := filepath.Join(bins, p.file)
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", tags, "-ldflags", ldflags, "-o", f, "./drivers/scratch")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.goos, "GOARCH="+p.goarch)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s/%s: %v\n%s", p.goos, p.goarch, err, b)
		}
		imageBins = append(imageBins, "-bin", p.goos+"/"+p.goarch+"="+f)
	}
	if err := os.Rename(filepath.Join(bins, platforms[0].file), filepath.Join(out, "ephemera-scratch")); err != nil {
		return err
	}
	imageBins[1] = "linux/amd64=" + filepath.Join(out, "ephemera-scratch")
	debs := "/var/cache/ephemera-image/debs" // make's IMAGE_CACHE for root
	if os.Getuid() != 0 {
		home, _ := os.UserHomeDir()
		debs = filepath.Join(home, ".cache", "ephemera-image", "debs")
	}
	args := append([]string{"run", "-trimpath", ".", "build", "-pins", "debian.pins", "-mirror", "http://deb.debian.org/debian",
		"-cache", debs}, imageBins...)
	// Since issue 46 the builder is any driver's: the name and the Debian packages
	// (their closure pinned in debian.pins, offline) are flags, as make image
	// passes them; a tree from before has them built in.
	if main, err := os.ReadFile(filepath.Join(src, "deploy", "images", "main.go")); err == nil && bytes.Contains(main, []byte(`fs.String("name"`)) {
		args = append(args, "-name", "ephemera-scratch", "-packages", "e2fsprogs,xfsprogs",
			"-files", "/sbin/mke2fs,/sbin/mkfs.ext4,/sbin/debugfs,/etc/mke2fs.conf,/sbin/mkfs.xfs",
			"-offline", "-security-mirror", "http://deb.debian.org/debian-security")
	}
	args = append(args, "-version", version, "-revision", commit, "-source", "https://github.com/ephemera-csi/ephemera",
		"-source-date-epoch", epoch, "-out", filepath.Join(out, "image"), "-digest-file", filepath.Join(out, "image.digest"))
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join(src, "deploy", "images")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("deploy/images build: %v\n%s", err, b)
	}
	if err := os.RemoveAll(bins); err != nil {
		return err
	}
	return renderTarget(ctx, src, filepath.Join(out, "manifests"))
}

// renderTarget renders releaseTarget with src's test/manifests into dir (-trimpath:
// Helm's packages are the build cache's make manifests filled, whatever src is).
func renderTarget(ctx context.Context, src, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "run", "-trimpath", "./cmd/render", "-out", dir, "-target", releaseTarget)
	cmd.Dir = filepath.Join(src, "test", "manifests")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("render %s: %v\n%s", releaseTarget, err, b)
	}
	if _, err := os.Stat(filepath.Join(dir, releaseTarget+".yaml")); err != nil {
		return errors.New("render wrote no " + releaseTarget + ".yaml")
	}
	return nil
}
