//go:build linux

package crash

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/stamp"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
	"github.com/ephemera-csi/ephemera/test/internal/sysloop"
)

const (
	driverName     = "scratch.csi.ephemera.dev"
	startTimeout   = 15 * time.Second
	exitTimeout    = 15 * time.Second
	kubeletTimeout = 20 * time.Second
)

// backend is one backend under test and the attributes a pod uses to get it.
type backend struct {
	name  string
	attrs map[string]string
}

var backends = []backend{
	{name: "tmpfs", attrs: map[string]string{"backend": "tmpfs", "size": "1Mi"}},
	{name: "dir", attrs: map[string]string{"backend": "dir"}},
	{name: "loop", attrs: map[string]string{"backend": "loop", "size": "16Mi"}},
}

// rig is one test's node: a kubelet root, a driver state dir, a socket, the
// kubelet simulator and the driver process currently running (if any).
type rig struct {
	t       *testing.T
	base    string // t.TempDir(), symlinks resolved: everything mounted is below it
	root    string // kubelet root
	state   string // driver state dir
	sockDir string
	sock    string
	logDir  string
	kubelet *drivertest.Kubelet
	drv     *driverProc
	runs    int
}

// newRig prepares the directories and registers the cleanup that kills a
// driver still running and unmounts everything below the test's directories,
// so nothing leaks even when the test fails.
func newRig(t *testing.T) *rig {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A short socket path: sun_path holds 108 bytes, test names are long.
	sockDir, err := os.MkdirTemp("", "crash")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{
		t:       t,
		base:    base,
		root:    filepath.Join(base, "kubelet"),
		state:   filepath.Join(base, "state"),
		sockDir: sockDir,
		sock:    filepath.Join(sockDir, "csi.sock"),
		logDir:  filepath.Join(base, "logs"),
	}
	for _, d := range []string{r.root, r.logDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(r.cleanup)
	r.kubelet = drivertest.NewKubelet(drivertest.KubeletOptions{
		Root:       r.root,
		Endpoint:   "unix://" + r.sock,
		DriverName: driverName,
		Timeout:    kubeletTimeout,
	})
	return r
}

func (r *rig) cleanup() {
	if d := r.drv; d != nil {
		_ = d.cmd.Process.Kill()
		select {
		case <-d.done:
		case <-time.After(exitTimeout):
			r.t.Errorf("driver pid %d did not exit after SIGKILL", d.cmd.Process.Pid)
		}
		r.drv = nil
	}
	for _, dir := range []string{r.base, r.sockDir} {
		if n, err := unmountAll(dir); err != nil {
			r.t.Errorf("cleanup: %v", err)
		} else if n > 0 && !r.t.Failed() {
			r.t.Errorf("cleanup had to unmount %d leftover mounts below %s", n, dir)
		}
	}
	if r.t.Failed() {
		r.dumpLogs()
	}
	if err := os.RemoveAll(r.sockDir); err != nil {
		r.t.Errorf("cleanup: %v", err)
	}
}

// unmountAll detaches every mount at or below dir, deepest (latest) first, and
// returns how many there were.
func unmountAll(dir string) (int, error) {
	n := 0
	for range 100 {
		infos, err := mount.ReadMountInfo()
		if err != nil {
			return n, err
		}
		under := mount.MountsUnder(infos, dir)
		if len(under) == 0 {
			return n, nil
		}
		slices.SortStableFunc(under, func(a, b mount.MountInfo) int {
			return len(b.MountPoint) - len(a.MountPoint)
		})
		for _, mi := range under {
			if err := syscall.Unmount(mi.MountPoint, syscall.MNT_DETACH); err == nil {
				n++
			} else if !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				return n, fmt.Errorf("unmounting %s: %w", mi.MountPoint, err)
			}
		}
	}
	return n, fmt.Errorf("mounts below %s keep coming back", dir)
}

func (r *rig) dumpLogs() {
	entries, err := os.ReadDir(r.logDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(r.logDir, e.Name()))
		if err != nil {
			continue
		}
		r.t.Logf("---- driver log %s ----\n%s", e.Name(), b)
	}
}

// driverProc is one run of the driver binary.
type driverProc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returned
	err  error         // cmd.Wait's error, valid after done
}

// start runs the driver, armed with failpoint when it is not empty, and waits
// until it serves: the socket exists and Probe answers ready.
func (r *rig) start(failpoint string) *driverProc {
	r.t.Helper()
	if r.drv != nil {
		r.t.Fatalf("start: driver run %s is still running", r.drv.name)
	}
	r.runs++
	name := fmt.Sprintf("%02d", r.runs)
	if failpoint != "" {
		name += "-" + failpoint
	}
	logf, err := os.Create(filepath.Join(r.logDir, name+".log"))
	if err != nil {
		r.t.Fatal(err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(driverBin,
		"--endpoint=unix://"+r.sock,
		"--nodeid=node-1",
		"--state-dir="+r.state,
		"--kubelet-root="+r.root,
		"--backend=tmpfs",
		"--backends=tmpfs,dir,loop",
		"--v=4",
	)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "EPHEMERA_FAILPOINT=")
	})
	if failpoint != "" {
		env = append(env, "EPHEMERA_FAILPOINT="+failpoint)
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	// A safety net for a test binary that dies without running its cleanups
	// (go test -timeout): the driver goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("starting driver: %v", err)
	}
	d := &driverProc{t: r.t, name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	r.drv = d
	if err := r.waitReady(d); err != nil {
		r.t.Fatalf("driver run %s: %v", name, err)
	}
	return d
}

func (r *rig) waitReady(d *driverProc) error {
	deadline := time.Now().Add(startTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			return fmt.Errorf("exited during startup: %v", d.err)
		default:
		}
		if _, err := os.Stat(r.sock); err == nil {
			if last = probe(r.sock); last == nil {
				return nil
			}
		} else {
			last = err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %v", startTimeout, last)
}

// probe calls Probe and NodeGetInfo once.
func probe(sock string) error {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		return err
	}
	if !resp.GetReady().GetValue() {
		return errors.New("Probe: not ready")
	}
	info, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return err
	}
	if info.GetNodeId() != "node-1" {
		return fmt.Errorf("NodeGetInfo: node ID %q, want node-1", info.GetNodeId())
	}
	return nil
}

// waitKilled waits for the driver to die and asserts it died from SIGKILL.
func (r *rig) waitKilled() {
	r.t.Helper()
	d := r.drv
	if d == nil {
		r.t.Fatal("waitKilled: no driver running")
	}
	select {
	case <-d.done:
	case <-time.After(exitTimeout):
		r.t.Fatalf("driver run %s still running %v after it should have been killed", d.name, exitTimeout)
	}
	r.drv = nil
	ws, ok := d.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		r.t.Fatalf("driver run %s: want death by SIGKILL, got %v", d.name, d.cmd.ProcessState)
	}
}

// kill sends SIGKILL to the driver, like the OOM killer or a kill -9.
func (r *rig) kill() {
	r.t.Helper()
	if r.drv == nil {
		r.t.Fatal("kill: no driver running")
	}
	if err := r.drv.cmd.Process.Kill(); err != nil {
		r.t.Fatalf("kill: %v", err)
	}
	r.waitKilled()
}

// stop sends SIGTERM and waits for a clean exit.
func (r *rig) stop() {
	r.t.Helper()
	d := r.drv
	if d == nil {
		r.t.Fatal("stop: no driver running")
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		r.t.Fatalf("stop: %v", err)
	}
	select {
	case <-d.done:
	case <-time.After(exitTimeout):
		r.t.Fatalf("driver run %s did not stop within %v of SIGTERM", d.name, exitTimeout)
	}
	r.drv = nil
	if d.err != nil {
		r.t.Fatalf("driver run %s: exit after SIGTERM: %v", d.name, d.err)
	}
}

// ---- assertions ----

// ctx is the context for kubelet operations.
func (r *rig) ctx() context.Context { return r.t.Context() }

// wantCrashError asserts err is what the kubelet sees when the driver dies
// during the call: a non-final error (the kubelet keeps the volume uncertain
// and calls again), Unavailable since the connection dropped.
func (r *rig) wantCrashError(op string, err error) {
	r.t.Helper()
	if err == nil {
		r.t.Fatalf("%s: got OK although the driver was killed during the call", op)
	}
	if drivertest.IsFinal(err) {
		r.t.Fatalf("%s: got final error %v; a crash must look transient to the kubelet", op, err)
	}
	if st, ok := status.FromError(err); !ok || st.Code() != codes.Unavailable {
		r.t.Fatalf("%s: got %v, want code Unavailable (connection lost)", op, err)
	}
}

func mountsAt(t *testing.T, path string) []mount.MountInfo {
	t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	var out []mount.MountInfo
	for _, mi := range infos {
		if mi.MountPoint == filepath.Clean(path) {
			out = append(out, mi)
		}
	}
	if n := mount.MountsAt(infos, path); n != len(out) {
		t.Fatalf("mount.MountsAt(%s) = %d, but %d mount lines match", path, n, len(out))
	}
	return out
}

// wantMounts asserts exactly n mounts at target.
func (r *rig) wantMounts(target string, n int) {
	r.t.Helper()
	if got := mountsAt(r.t, target); len(got) != n {
		r.t.Fatalf("%d mounts at %s, want %d: %+v", len(got), target, n, got)
	}
}

// wantPublished asserts the volume is mounted exactly once with the backend's
// filesystem and that the kubelet considers it mounted.
func (r *rig) wantPublished(pod *drivertest.Pod, vol drivertest.InlineVolume, b backend) string {
	r.t.Helper()
	target := r.kubelet.TargetPath(pod, vol.Name)
	mis := mountsAt(r.t, target)
	if len(mis) != 1 {
		r.t.Fatalf("%d mounts at %s, want exactly 1: %+v", len(mis), target, mis)
	}
	switch {
	case b.name == "tmpfs":
		if mis[0].FSType != "tmpfs" || !strings.Contains(mis[0].SuperOptions, "size=1024k") {
			r.t.Fatalf("%s: want a 1Mi tmpfs, got %s %s", target, mis[0].FSType, mis[0].SuperOptions)
		}
	case b.name == "loop":
		if mis[0].FSType != "ext4" || !strings.HasPrefix(mis[0].Source, "/dev/loop") {
			r.t.Fatalf("%s: want ext4 on a loop device, got %s on %s", target, mis[0].FSType, mis[0].Source)
		}
	default:
		if want := "/volumes/" + api.VolumeHandle(pod.UID, vol.Name); !strings.HasSuffix(mis[0].Root, want) {
			r.t.Fatalf("%s: want a bind mount of <state-dir>%s, got root %s", target, want, mis[0].Root)
		}
	}
	if s := r.kubelet.State(pod, vol.Name); s != drivertest.StateMounted {
		r.t.Fatalf("kubelet state of %s: %v, want mounted", vol.Name, s)
	}
	return target
}

// writeData writes a file into the published volume and reads it back.
func (r *rig) writeData(target, content string) {
	r.t.Helper()
	p := filepath.Join(target, "data")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		r.t.Fatalf("writing into the volume: %v", err)
	}
	r.wantData(target, content)
}

// wantData asserts the file written by writeData has content; "" means the file
// must not exist (a fresh volume).
func (r *rig) wantData(target, content string) {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(target, "data"))
	switch {
	case content == "" && errors.Is(err, fs.ErrNotExist):
	case content == "":
		r.t.Fatalf("want a fresh, empty volume at %s, found data %q (err %v)", target, b, err)
	case err != nil:
		r.t.Fatalf("reading from the volume: %v", err)
	case string(b) != content:
		r.t.Fatalf("volume data at %s is %q, want %q", target, b, content)
	}
}

// wantClean asserts, with the driver stopped, that nothing is left: no mounts
// below the kubelet root or the state dir, no pod directories (so no target
// and no kubelet-owned parents), no volume records, no dir-backend storage,
// and the kubelet tracks none of the volumes.
func (r *rig) wantClean(pods ...*drivertest.Pod) {
	r.t.Helper()
	if r.drv != nil {
		r.t.Fatal("wantClean: stop the driver first")
	}
	infos, err := mount.ReadMountInfo()
	if err != nil {
		r.t.Fatal(err)
	}
	if m := mount.MountsUnder(infos, r.base); len(m) > 0 {
		r.t.Errorf("%d leaked mounts: %+v", len(m), m)
	}
	for _, pod := range pods {
		if _, err := os.Lstat(r.kubelet.PodDir(pod)); !errors.Is(err, fs.ErrNotExist) {
			r.t.Errorf("pod directory %s still exists (err %v): %s", r.kubelet.PodDir(pod), err, tree(r.kubelet.PodDir(pod)))
		}
	}
	if entries, err := os.ReadDir(filepath.Join(r.root, "pods")); err == nil && len(entries) > 0 {
		r.t.Errorf("leaked directories below the kubelet root: %s", tree(r.root))
	}
	st, err := boltstore.Open(filepath.Join(r.state, framework.StateFile), boltstore.Options{Timeout: 2 * time.Second})
	if err != nil {
		r.t.Fatalf("opening the driver state: %v", err)
	}
	recs, err := st.List(context.Background())
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.t.Fatalf("listing records: %v", err)
	}
	for _, rec := range recs {
		r.t.Errorf("leaked record %s phase %s target %s", rec.VolumeID, rec.Phase, rec.TargetPath)
	}
	entries, err := os.ReadDir(filepath.Join(r.state, "volumes"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != stamp.FileName {
			r.t.Errorf("leaked dir-backend storage %s", filepath.Join(r.state, "volumes", e.Name()))
		}
	}
	loopDir := filepath.Join(r.state, "loop")
	entries, err = os.ReadDir(loopDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != stamp.FileName {
			r.t.Errorf("leaked loop backing file %s", filepath.Join(loopDir, e.Name()))
		}
	}
	for _, dev := range sysloop.Below(loopDir) {
		r.t.Errorf("leaked loop device %s (%s)", dev.Path, dev.BackingFile)
	}
	if r.t.Failed() {
		r.t.FailNow()
	}
}

// tree lists the paths below dir, for failure messages.
func tree(dir string) string {
	var b strings.Builder
	_ = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err == nil {
			fmt.Fprintf(&b, "\n  %s", p)
		}
		return nil
	})
	return b.String()
}
