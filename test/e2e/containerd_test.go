//go:build e2e && linux

package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	testImageRef  = "ephemera.local/e2e/testbin:v1"
	pauseImageRef = "ephemera.local/e2e/pause:v1"
)

// Containerd releases the harness runs (EPHEMERA_E2E_CONTAINERD, make's CONTAINERD).
const (
	// containerd2 is the release test/e2e/containerd/go.mod pins, built by
	// build-containerd.sh from the Go module proxy (the default).
	containerd2 = "2"
	// containerd16 is Debian 12's package (install-deps.sh), 1.6.20.
	containerd16 = "1.6"
)

// containerdInstall is the containerd the runtime "containerd" runs: its
// binaries (containerd, containerd-shim-runc-v2, ctr) and its release. runc is
// Debian's for both (install-deps.sh), found on PATH by the shim.
type containerdInstall struct {
	major   string // containerd2 or containerd16
	version string // containerd --version's, e.g. "v2.4.2"
	bin     string // containerd
	shim    string // containerd-shim-runc-v2
	ctr     string // ctr of the same release
	dir     string // the directory of the three, put first on containerd's PATH
	// usernsRunc is the runc build-runc.sh built (containerd 2 only): the binary
	// of the runtime handler usernsHandler, which TestUserNamespaces' pods use
	// through the RuntimeClass of the same name. Empty with usernsErr saying why
	// (the other scenarios do not need it).
	usernsRunc string
	usernsErr  error
}

// usernsHandler is containerd 2's runtime handler (and the RuntimeClass) whose
// runc can make ID-mapped mounts (runc >= 1.2, build-runc.sh); the default
// handler "runc" runs Debian's 1.1.5, which cannot.
const usernsHandler = "runc-userns"

// findContainerd finds the containerd of EPHEMERA_E2E_CONTAINERD: for 2 the
// binaries build-containerd.sh prints (a no-op when cached) unless
// EPHEMERA_E2E_CONTAINERD_BIN names their directory, for 1.6 Debian's on PATH.
// containerd --version must be of that release.
func (c *cluster) findContainerd(ctx context.Context) error {
	ci := containerdInstall{major: envOr("EPHEMERA_E2E_CONTAINERD", containerd2)}
	switch ci.major {
	case containerd2:
		ci.dir = os.Getenv("EPHEMERA_E2E_CONTAINERD_BIN")
		if ci.dir == "" {
			cmd := exec.CommandContext(ctx, "bash", filepath.Join(c.repoRoot, "test/e2e/build-containerd.sh"))
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				return fmt.Errorf("test/e2e/build-containerd.sh: %w", err)
			}
			ci.dir = strings.TrimSpace(string(out))
		}
		ci.bin, ci.shim, ci.ctr = filepath.Join(ci.dir, "containerd"), filepath.Join(ci.dir, "containerd-shim-runc-v2"), filepath.Join(ci.dir, "ctr")
		ci.usernsRunc, ci.usernsErr = c.findUsernsRunc(ctx)
		if ci.usernsErr != nil {
			c.logf("no runtime handler %s (TestUserNamespaces will fail): %v", usernsHandler, ci.usernsErr)
		}
	case containerd16:
		for _, b := range []*struct {
			name string
			path *string
		}{{"containerd", &ci.bin}, {"containerd-shim-runc-v2", &ci.shim}, {"ctr", &ci.ctr}} {
			p, err := exec.LookPath(b.name)
			if err != nil {
				return fmt.Errorf("EPHEMERA_E2E_CONTAINERD=1.6 needs Debian's containerd (%s): run test/e2e/install-deps.sh (or set EPHEMERA_E2E_RUNTIME=fake): %w", b.name, err)
			}
			*b.path = p
		}
		ci.dir = filepath.Dir(ci.bin)
	default:
		return fmt.Errorf("EPHEMERA_E2E_CONTAINERD=%q: want %s (built by test/e2e/build-containerd.sh) or %s (Debian's)", ci.major, containerd2, containerd16)
	}
	for _, b := range []string{ci.bin, ci.shim, ci.ctr} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("containerd %s: %w", ci.major, err)
		}
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return fmt.Errorf("runc not found: run test/e2e/install-deps.sh: %w", err)
	}
	out, err := exec.CommandContext(ctx, ci.bin, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", ci.bin, err)
	}
	// "containerd github.com/containerd/containerd v1.6.20~ds1 1.6.20~ds1-1+b1"
	f := strings.Fields(string(out))
	if len(f) < 3 {
		return fmt.Errorf("%s --version: %q", ci.bin, out)
	}
	ci.version = f[2]
	if !strings.HasPrefix(strings.TrimPrefix(ci.version, "v"), ci.major+".") {
		return fmt.Errorf("EPHEMERA_E2E_CONTAINERD=%s, but %s is %s", ci.major, ci.bin, ci.version)
	}
	c.ctrd = ci
	c.logf("containerd %s (%s), runc %s", ci.version, ci.dir, runcVersion(ctx))
	return nil
}

// findUsernsRunc is the runc build-runc.sh prints the directory of (a no-op
// when cached), or the one in EPHEMERA_E2E_RUNC_BIN's directory.
func (c *cluster) findUsernsRunc(ctx context.Context) (string, error) {
	dir := os.Getenv("EPHEMERA_E2E_RUNC_BIN")
	if dir == "" {
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(c.repoRoot, "test/e2e/build-runc.sh"))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("test/e2e/build-runc.sh: %w", err)
		}
		dir = strings.TrimSpace(string(out))
	}
	bin := filepath.Join(dir, "runc")
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	c.logf("runtime handler %s: %s", usernsHandler, first)
	return bin, nil
}

// runcVersion is the first line of runc --version ("runc version 1.1.5+ds1").
func runcVersion(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "runc", "--version").Output()
	if err != nil {
		return "unknown: " + err.Error()
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimPrefix(first, "runc version ")
}

// The plugins a private containerd does without: snapshotters the harness does
// not use (containerd 2's build leaves btrfs, devmapper and zfs out, see
// build-containerd.sh; aufs exists in 1.6 only) and tracing. containerd 2 also
// without NRI (on by default there, absent from 1.6), which would serve a
// machine-wide socket, /var/run/nri/nri.sock, that two nodes (TestTwoNodes) would
// share.
func (ci containerdInstall) disabledPlugins() []string {
	p := []string{
		"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
		"io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
	}
	if ci.major == containerd2 {
		p = append(p, "io.containerd.nri.v1.nri")
	}
	return p
}

// containerdConfig is a private containerd instance: own root, state, sockets, runc
// root and CNI dirs below the run root. restrict_oom_score_adj is required on these
// VMs (a negative oom_score_adj write fails and runc then cannot start containers).
// containerd 2 reads configuration version 3 (plugin IDs io.containerd.cri.v1.images
// and io.containerd.cri.v1.runtime instead of io.containerd.grpc.v1.cri; the sandbox
// image is a pinned image; the snapshotter belongs to the images plugin; CNI's bin_dirs
// a list) and migrates it to its latest at start (4 since 2.3); 1.6 reads version 2.
// containerd 2's shim is named by path (runtime_path): on PATH, Debian's 1.6 shim
// would be found first. Both run runc with cgroupfs (SystemdCgroup = false, the
// kubelet's cgroupDriver) on these cgroup v1 machines: containerd 2 still supports
// cgroup v1, deprecated since 2.2 (supported on a maintained branch until May 2029).
// Both read registry hosts from config_path (registryConfigDir: the e2e registry's
// hosts.toml, written when it starts).
func (n *node) containerdConfig() string {
	ci := n.c.ctrd
	d := filepath.Join(n.dir, "containerd")
	var disabled []string
	for _, p := range ci.disabledPlugins() {
		disabled = append(disabled, strconv.Quote(p))
	}
	common := fmt.Sprintf(`root = %q
state = %q
disabled_plugins = [%s]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), strings.Join(disabled, ", "), n.ctrSock, n.ctrSock+".ttrpc",
		filepath.Join(d, "opt"))
	if ci.major == containerd16 {
		return "version = 2\n" + common + fmt.Sprintf(`
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
`, pauseImageRef, n.runcRoot, filepath.Join(d, "cni-bin"), filepath.Join(d, "cni-conf"), n.registryConfigDir())
	}
	return "version = 3\n" + common + fmt.Sprintf(`
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q

  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = %q

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
%s
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
`, pauseImageRef, n.registryConfigDir(), ci.shim, n.runcRoot, n.usernsRuntime(), filepath.Join(d, "cni-bin"), filepath.Join(d, "cni-conf"))
}

// usernsRuntime is containerd 2's runtime handler usernsHandler: the same shim
// with build-runc.sh's runc (BinaryName) and a runc root of its own
// (usernsRuncRoot: a state written by runc 1.5 is not Debian 1.1.5's to delete).
// The CRI plugin asks that runc for its features at start and reports the
// handler as supporting user namespaces (RuntimeHandlerFeatures.user_namespaces,
// which the kubelet requires for a hostUsers: false pod) when they list the
// user namespace and ID-mapped mounts.
func (n *node) usernsRuntime() string {
	ci := n.c.ctrd
	if ci.usernsRunc == "" {
		return ""
	}
	return fmt.Sprintf(`
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.%s]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = %q

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.%s.options]
        BinaryName = %q
        SystemdCgroup = false
        Root = %q
`, usernsHandler, ci.shim, usernsHandler, ci.usernsRunc, usernsRuncRoot(n.dir))
}

// usernsRuncRoot is the runc root of the usernsHandler runtime of the node
// whose files are in dir; usernsRuncRoot(dir)+".bin" names the runc that
// created its containers (removeContainers deletes them with it).
func usernsRuncRoot(dir string) string { return filepath.Join(dir, "runc-userns") }

func (n *node) startContainerd(ctx context.Context) error {
	c := n.c
	d := filepath.Join(n.dir, "containerd")
	for _, sub := range []string{"root", "state", "opt", "cni-bin", "cni-conf", "certs.d"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o711); err != nil {
			return err
		}
	}
	n.ctrSock = filepath.Join(d, "c.sock")
	// runc keeps its state in <Root>/<namespace>; below the run root a later run can
	// find and delete containers that a crashed run left behind.
	n.runcRoot = filepath.Join(n.dir, "runc")
	if c.ctrd.usernsRunc != "" {
		if err := os.WriteFile(usernsRuncRoot(n.dir)+".bin", []byte(c.ctrd.usernsRunc), 0o644); err != nil {
			return err
		}
	}
	if err := n.writePodNetwork(); err != nil {
		return err
	}
	cfg := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfg, []byte(n.containerdConfig()), 0o644); err != nil {
		return err
	}
	n.criEndpoint = "unix://" + n.ctrSock
	var err error
	n.cri, err = c.startProc("containerd"+n.suffix, c.ctrd.bin, []string{"--config", cfg, "--log-level", "info"},
		[]string{"PATH=" + c.ctrd.dir + string(os.PathListSeparator) + os.Getenv("PATH")})
	if err != nil {
		return err
	}
	err = waitFor(ctx, 30*time.Second, 100*time.Millisecond, "containerd socket", func() (bool, error) {
		if n.cri.exited() {
			return false, stop(fmt.Errorf("containerd exited, see %s", n.cri.logPath))
		}
		out, err := exec.Command(c.ctrd.ctr, "--address", n.ctrSock, "version").CombinedOutput()
		if err != nil {
			return false, nil
		}
		return bytes.Contains(out, []byte("Server:")), nil
	})
	if err != nil {
		return err
	}
	t0 := time.Now()
	tarPath := filepath.Join(n.dir, "images.tar")
	if err := writeDockerArchive(tarPath, c.testbinHost, map[string][]string{
		testImageRef:  {"pause"},
		pauseImageRef: {"pause"},
	}); err != nil {
		return fmt.Errorf("build images: %w", err)
	}
	// containerd 2's ctr imports through the transfer service (1.6's writes the
	// content store itself); both unpack into the default snapshotter, overlayfs,
	// which the CRI plugin uses.
	if out, err := n.ctr(ctx, "images", "import", tarPath); err != nil {
		return fmt.Errorf("ctr images import: %v\n%s", err, out)
	}
	c.testImage, c.pauseImage = testImageRef, pauseImageRef
	c.step("images built and imported"+n.suffix, t0)
	return nil
}

// ctr runs the containerd CLI of the running release against the private instance
// in the k8s.io namespace.
func (n *node) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, n.c.ctrd.ctr, append([]string{"--address", n.ctrSock, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// writeDockerArchive writes a docker-archive tar (the `docker save` format, which
// `ctr images import` reads) with one single-layer image per tag. The layer holds
// the static binary at /testbin and empty /tmp, /data, /etc; each image's
// entrypoint is /testbin with the given default arguments.
func writeDockerArchive(path, binary string, images map[string][]string) error {
	return writeImageArchive(path, binary, "testbin", images)
}

// writeImageArchive is writeDockerArchive with the binary at /<inImage> (e.g.
// usr/local/bin/driver, where deploy/images/Dockerfile.driver puts a driver),
// which is also the entrypoint.
func writeImageArchive(path, binary, inImage string, images map[string][]string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	mtime := time.Unix(0, 0)
	hdrs := []*tar.Header{
		{Name: "tmp/", Mode: 0o1777, Typeflag: tar.TypeDir, ModTime: mtime},
		{Name: "data/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: mtime},
		{Name: "etc/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: mtime},
	}
	// The binary's parent directories (usr/, usr/local/, ...), parents first.
	if dir := filepath.Dir(inImage); dir != "." {
		parts := strings.Split(dir, "/")
		for i := range parts {
			hdrs = append(hdrs, &tar.Header{Name: strings.Join(parts[:i+1], "/") + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: mtime})
		}
	}
	for _, h := range hdrs {
		if err := lw.WriteHeader(h); err != nil {
			return err
		}
	}
	if err := lw.WriteHeader(&tar.Header{Name: inImage, Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg, ModTime: mtime}); err != nil {
		return err
	}
	if _, err := lw.Write(bin); err != nil {
		return err
	}
	if err := lw.Close(); err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerHex := hex.EncodeToString(layerSum[:])
	layerName := layerHex + "/layer.tar"

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: mtime}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: layerHex + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: mtime}); err != nil {
		return err
	}
	if err := add(layerName, layer.Bytes()); err != nil {
		return err
	}
	type manifestEntry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	tags := make([]string, 0, len(images))
	for tag := range images {
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	var manifest []manifestEntry
	for _, tag := range tags {
		cfg := map[string]any{
			"architecture": runtime.GOARCH,
			"os":           "linux",
			"created":      mtime.UTC().Format(time.RFC3339),
			"config": map[string]any{
				"Entrypoint": []string{"/" + inImage},
				"Cmd":        images[tag],
				"Env":        []string{"PATH=/"},
				"WorkingDir": "/",
				"Labels":     map[string]string{"dev.ephemera.e2e.image": strings.Split(tag, ":")[0]},
			},
			"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerHex}},
			"history": []map[string]string{{"created": mtime.UTC().Format(time.RFC3339), "created_by": "ephemera e2e harness"}},
		}
		cb, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		cs := sha256.Sum256(cb)
		cfgName := hex.EncodeToString(cs[:]) + ".json"
		if err := add(cfgName, cb); err != nil {
			return err
		}
		manifest = append(manifest, manifestEntry{Config: cfgName, RepoTags: []string{tag}, Layers: []string{layerName}})
	}
	mb, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	if err := add("manifest.json", mb); err != nil {
		return err
	}
	return tw.Close()
}
