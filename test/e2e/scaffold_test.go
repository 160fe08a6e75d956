//go:build e2e && linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
	corev1 "k8s.io/api/core/v1"
)

// The SDK's module and the image builder's, as a release's module proxy serves them.
const (
	sdkModule     = "github.com/ephemera-csi/ephemera"
	builderModule = sdkModule + "/deploy/images"
)

// TestScaffoldedDriver is a new author's way from an empty directory to a pod
// (issue 46): `ephemera new` (this checkout's cmd/ephemera) scaffolds a content
// driver requiring the SDK at a version only a file-based module proxy serves,
// as a release's bundle does (this checkout's module and the image builder's,
// zipped as `go mod download` would fetch them); the scaffold's own `make
// image` builds its image with the SDK's daemonless builder at that version
// (linux/amd64 only), the archive is imported into the node's containerd, the
// generic chart is rendered with the scaffold's deploy/values.yaml (and the
// node's values over it) and applied, and the scaffold's deploy/pod.yaml reads
// what the driver wrote. Deleting the pod and the release leaves nothing of
// the driver on the node. Every module comes from the proxy or the module
// cache: nothing is fetched from the network.
func TestScaffoldedDriver(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("runs the driver in a container: EPHEMERA_E2E_RUNTIME=containerd")
	}
	requireDriver(t)
	ctx := context.Background()
	dir := filepath.Join(c.root, "scaffold")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const (
		name     = "e2e-whoami"
		drvName  = "e2e-whoami.csi.example.com"
		repo     = "localhost/e2e-whoami"
		podNS    = "e2e-scaffold"
		tagInVal = "v0.1.0" // the tag the scaffold's deploy/values.yaml names
	)

	// The SDK as a release serves it.
	t0 := time.Now()
	version, env := c.sdkProxy(t, filepath.Join(dir, "goproxy"))
	c.step("the SDK at "+version+" in a file-based module proxy", t0)

	// ephemera new.
	t1 := time.Now()
	mod := filepath.Join(dir, name)
	scaffold := exec.CommandContext(ctx, "go", "run", "-trimpath", "./cmd/ephemera", "new", "-kind", "content",
		"-driver-name", drvName, "-image", repo, "-sdk", version, "example.com/"+name, mod)
	scaffold.Dir = c.repoRoot
	scaffold.Env = env
	if out, err := scaffold.CombinedOutput(); err != nil {
		t.Fatalf("ephemera new: %v\n%s", err, out)
	}
	c.step("ephemera new example.com/"+name, t1)

	// make image: the scaffold's Makefile runs the SDK's builder at go.mod's
	// version. Its archive names the index REPO:VERSION and REPO@DIGEST
	// (io.containerd.image.name, the builder's -repository): a plain import
	// creates both names, the second the one the kubelet looks up for an image
	// named by digest.
	t2 := time.Now()
	// VERSION as `make release VERSION=...` sets it: the tag deploy/values.yaml names.
	mk := exec.CommandContext(ctx, "make", "image", "PLATFORMS=linux/amd64", "VERSION="+tagInVal)
	mk.Dir = mod
	mk.Env = env
	out, err := mk.CombinedOutput()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	archives, _ := filepath.Glob(filepath.Join(mod, "_output", "*.tar"))
	if len(archives) != 1 {
		t.Fatalf("make image wrote %d archives (%v), want one\n%s", len(archives), archives, out)
	}
	if out, err := c.ctr(ctx, "images", "import", "--all-platforms", archives[0]); err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", archives[0], err, out)
	}
	image := repo + ":" + tagInVal
	if ls, err := c.ctr(ctx, "images", "ls", "-q"); err != nil || !strings.Contains(ls, image+"\n") || !strings.Contains(ls, repo+"@sha256:") {
		t.Fatalf("the scaffold's archive imported without --base-name named no %s and %s@sha256:... (ctr images ls: %v):\n%s", image, repo, err, ls)
	}
	c.step("make image (the SDK's builder) and ctr images import: "+image, t2)

	// The chart with the scaffold's values, for this node.
	t3 := time.Now()
	valuesFile, stateRoot := c.chartValuesForNode(t, dir)
	rendered := filepath.Join(dir, name+".yaml")
	if b, err := c.render("-chart", filepath.Join(c.repoRoot, "deploy", "helm", "ephemera-driver"), "-release", name,
		"-values", filepath.Join(mod, "deploy", "values.yaml"), "-values", valuesFile, "-out", rendered).CombinedOutput(); err != nil {
		t.Fatalf("render the chart with %s's values: %v\n%s", name, err, b)
	}
	objs, err := readObjects(rendered)
	if err != nil {
		t.Fatal(err)
	}
	var appPod *corev1.Pod
	d := c.deployChartDriver(t, drvName, objs, stateRoot, func() *corev1.Pod { return appPod })
	if got := d.pod.Spec.Containers[0].Image; got != image {
		t.Errorf("the driver's pod runs %q, want the scaffold's %q", got, image)
	}
	c.step(fmt.Sprintf("chart installed with %s's values (%d objects), the driver registered", name, len(objs)), t3)

	// The scaffold's pod: it reads what the driver wrote.
	t4 := time.Now()
	var vals struct {
		Admission struct{ NamespaceLabel struct{ Key, Value string } }
	}
	if err := decodeFile(filepath.Join(mod, "deploy", "values.yaml"), &vals); err != nil {
		t.Fatal(err)
	}
	c.allowInline(t, podNS, vals.Admission.NamespaceLabel.Key, vals.Admission.NamespaceLabel.Value)
	var p corev1.Pod
	if err := decodeFile(filepath.Join(mod, "deploy", "pod.yaml"), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Containers) != 1 || len(p.Spec.Containers[0].VolumeMounts) != 1 || len(p.Spec.Volumes) != 1 ||
		p.Spec.Volumes[0].CSI == nil || p.Spec.Volumes[0].CSI.Driver != drvName {
		t.Fatalf("%s/deploy/pod.yaml: want one container and one inline volume of %s", name, drvName)
	}
	mnt := p.Spec.Containers[0].VolumeMounts[0].MountPath
	c.onThisNode(&p, podNS, steps(st("read", mnt+"/pod"), st("pause")))
	appPod = c.createPod(t, &p)
	appPod = c.waitRunning(t, appPod, runningTimeout)
	wantStep(t, c.output(t, appPod, 1), 0, "read ok", fmt.Sprintf("content=%q", podNS+"/"+appPod.Name+"\n"))
	vol := appPod.Spec.Volumes[0]
	if ms := mountsAt(c.hostVolumePath(appPod, vol)); len(ms) != 1 || ms[0].FSType != "tmpfs" {
		t.Errorf("host mounts at the target: %+v, want one tmpfs (the scaffold's, propagated from its container)", ms)
	}
	c.step("the scaffold's pod read what its driver wrote", t4)

	t5 := time.Now()
	c.deletePod(t, appPod, goneTimeout)
	c.cleanedUp(t, appPod, vol)
	c.removeChartDriver(t, d, appPod)
	appPod = nil
	c.step("pod and release deleted, nothing of "+name+" left", t5)
}

// sdkProxy writes a file-based Go module proxy into dir serving this checkout's
// module and the image builder's (deploy/images) at one pseudo-version, as a
// release's goproxy/ serves them: each zipped from the files git knows in the
// working tree (tracked, and untracked but not ignored), nested modules left
// out, as `go mod download` of a tag would fetch them (test/manifests' Release
// makes a release's the same way, from a commit's files). It returns the version and
// the environment an author's commands run in: that proxy, then the module
// cache's download directory (itself a file proxy; make test has filled it), no
// checksum database (the proxy's zips are this tree's), the local toolchain.
func (c *cluster) sdkProxy(t *testing.T, dir string) (string, []string) {
	t.Helper()
	head, err := exec.Command("git", "-C", c.repoRoot, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	version := module.PseudoVersion("v0", "", time.Now().UTC().Truncate(time.Second), strings.TrimSpace(string(head))[:12])
	files, err := exec.Command("git", "-C", c.repoRoot, "ls-files", "--cached", "--others", "--exclude-standard", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var all []string
	for _, f := range strings.Split(string(files), "\x00") {
		if _, err := os.Lstat(filepath.Join(c.repoRoot, f)); f != "" && err == nil { // not deleted in the working tree
			all = append(all, f)
		}
	}
	for _, m := range []struct{ path, dir string }{{sdkModule, ""}, {builderModule, "deploy/images/"}} {
		// modzip leaves out the files of nested modules (directories with a go.mod).
		var zf []modzip.File
		for _, f := range all {
			if rel, ok := strings.CutPrefix(f, m.dir); ok {
				zf = append(zf, treeFile{root: c.repoRoot, path: f, rel: rel})
			}
		}
		at := filepath.Join(dir, filepath.FromSlash(m.path), "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			t.Fatal(err)
		}
		var zb bytes.Buffer
		if err := modzip.Create(&zb, module.Version{Path: m.path, Version: version}, zf); err != nil {
			t.Fatalf("zip %s: %v", m.path, err)
		}
		gomod, err := os.ReadFile(filepath.Join(c.repoRoot, m.dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		info, _ := json.Marshal(map[string]string{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
		for name, b := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info, version + ".mod": gomod, version + ".zip": zb.Bytes()} {
			if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	cache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"GOPROXY=file://"+dir+",file://"+filepath.Join(strings.TrimSpace(string(cache)), "cache", "download"),
		"GOSUMDB=off", "GOFLAGS=", "GOWORK=off", "GOTOOLCHAIN=local", "CGO_ENABLED=0")
	return version, env
}

// treeFile is a file of the working tree in a module zip.
type treeFile struct{ root, path, rel string }

func (f treeFile) Path() string                 { return f.rel }
func (f treeFile) Lstat() (fs.FileInfo, error)  { return os.Lstat(filepath.Join(f.root, f.path)) }
func (f treeFile) Open() (io.ReadCloser, error) { return os.Open(filepath.Join(f.root, f.path)) }
