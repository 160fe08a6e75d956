//go:build e2e

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
	"strings"
	"time"
)

const (
	testImageRef  = "ephemera.local/e2e/testbin:v1"
	pauseImageRef = "ephemera.local/e2e/pause:v1"
)

// containerdConfig is a private containerd instance: own root, state, sockets, runc
// root and CNI dirs below the run root. restrict_oom_score_adj is required on these
// VMs (a negative oom_score_adj write fails and runc then cannot start containers).
func (n *node) containerdConfig() string {
	d := filepath.Join(n.dir, "containerd")
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

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
`, filepath.Join(d, "root"), filepath.Join(d, "state"), n.ctrSock, n.ctrSock+".ttrpc",
		filepath.Join(d, "opt"), pauseImageRef, n.runcRoot,
		filepath.Join(d, "cni-bin"), filepath.Join(d, "cni-conf"))
}

func (n *node) startContainerd(ctx context.Context) error {
	c := n.c
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return fmt.Errorf("EPHEMERA_E2E_RUNTIME=containerd needs containerd and runc: run test/e2e/install-deps.sh (or set EPHEMERA_E2E_RUNTIME=fake): %w", err)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return fmt.Errorf("runc not found: run test/e2e/install-deps.sh: %w", err)
	}
	d := filepath.Join(n.dir, "containerd")
	for _, sub := range []string{"root", "state", "opt", "cni-bin", "cni-conf"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o711); err != nil {
			return err
		}
	}
	n.ctrSock = filepath.Join(d, "c.sock")
	// runc keeps its state in <Root>/<namespace>; below the run root a later run can
	// find and delete containers that a crashed run left behind.
	n.runcRoot = filepath.Join(n.dir, "runc")
	cfg := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfg, []byte(n.containerdConfig()), 0o644); err != nil {
		return err
	}
	n.criEndpoint = "unix://" + n.ctrSock
	n.cri, err = c.startProc("containerd"+n.suffix, bin, []string{"--config", cfg, "--log-level", "info"}, nil)
	if err != nil {
		return err
	}
	err = waitFor(ctx, 30*time.Second, 100*time.Millisecond, "containerd socket", func() (bool, error) {
		if n.cri.exited() {
			return false, stop(fmt.Errorf("containerd exited, see %s", n.cri.logPath))
		}
		out, err := exec.Command("ctr", "--address", n.ctrSock, "version").CombinedOutput()
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
	if out, err := n.ctr(ctx, "images", "import", tarPath); err != nil {
		return fmt.Errorf("ctr images import: %v\n%s", err, out)
	}
	c.testImage, c.pauseImage = testImageRef, pauseImageRef
	c.step("images built and imported"+n.suffix, t0)
	return nil
}

// ctr runs the containerd CLI against the private instance in the k8s.io namespace.
func (n *node) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.ctrSock, "--namespace", "k8s.io"}, args...)...)
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
