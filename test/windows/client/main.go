// Command ephemera-wintest drives a running scratch driver on a Windows node the
// way the kubelet does (framework/drivertest.Kubelet over the driver's unix
// socket) and checks what lands on the node: the directory link at the target,
// the data behind it, the VHDX size limit, volume stats, and that unpublish
// leaves nothing behind. test/windows/run.ps1 starts the driver and runs it;
// it can also be run by hand against a driver started with a throw-away
// --state-dir and --kubelet-root.
//
// Output: one line per check, "RESULT<TAB>check<TAB>PASS|FAIL<TAB>detail",
// then exit status 1 if any check failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

var (
	failed bool
	node   csi.NodeClient // for NodeGetVolumeStats, which the kubelet simulator does not send
)

// dial connects to a unix:// endpoint (unix://C:\path on Windows).
func dial(endpoint string) (*grpc.ClientConn, error) {
	path := strings.TrimPrefix(strings.TrimPrefix(endpoint, "unix://"), "unix:")
	return grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}))
}

func result(check string, err error, detail string) bool {
	status := "PASS"
	if err != nil {
		status, detail, failed = "FAIL", err.Error(), true
	}
	fmt.Printf("RESULT\t%s\t%s\t%s\n", check, status, strings.ReplaceAll(detail, "\t", " "))
	return err == nil
}

func main() {
	var (
		endpoint    = flag.String("endpoint", "", `The driver's endpoint, unix://C:\...\csi.sock. Required.`)
		kubeletRoot = flag.String("kubelet-root", "", "The --kubelet-root the driver was started with (a throw-away directory). Required.")
		stateDir    = flag.String("state-dir", "", "The driver's --state-dir. Required.")
		driverName  = flag.String("driver-name", "scratch.csi.ephemera.dev", "The driver's --driver-name.")
		sizeFlag    = flag.String("vhdx-size", "128Mi", "Size of the vhdx volume (binary suffix Mi or Gi).")
		skipVHDX    = flag.Bool("skip-vhdx", false, "Test the dir backend only.")
		dirRoot     = flag.String("dir-root", "", `Where the driver keeps dir volumes. Empty: <state-dir>\volumes, the hostprocess mode's (run.ps1 -Mode csi-proxy passes <kubelet-root>\plugins\<driver-name>\volumes).`)
		timeout     = flag.Duration("timeout", 5*time.Minute, "Overall timeout.")
	)
	flag.Parse()
	if *endpoint == "" || *kubeletRoot == "" || *stateDir == "" {
		fmt.Fprintln(os.Stderr, "--endpoint, --kubelet-root and --state-dir are required")
		os.Exit(2)
	}
	size, err := parseSize(*sizeFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := dial(*endpoint)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer conn.Close()
	node = csi.NewNodeClient(conn)
	k := drivertest.NewKubelet(drivertest.KubeletOptions{Root: *kubeletRoot, Endpoint: *endpoint, DriverName: *driverName})

	if *dirRoot == "" {
		*dirRoot = filepath.Join(*stateDir, "volumes")
	}
	testDir(ctx, k, *dirRoot)
	if !*skipVHDX {
		testVHDX(ctx, k, *stateDir, size)
	}
	if failed {
		os.Exit(1)
	}
}

func parseSize(s string) (int64, error) {
	for suffix, shift := range map[string]uint{"Gi": 30, "Mi": 20} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			var v int64
			if _, err := fmt.Sscan(n, &v); err == nil && v > 0 {
				return v << shift, nil
			}
		}
	}
	return 0, fmt.Errorf("--vhdx-size %q: want a number with Mi or Gi", s)
}

// checkLink checks that target is a link (symlink or junction) to want.
func checkLink(target, want string) error {
	fi, err := os.Lstat(target)
	if err != nil {
		return err
	}
	if fi.Mode()&(fs.ModeSymlink|fs.ModeIrregular) == 0 {
		return fmt.Errorf("%s is %v, not a link", target, fi.Mode())
	}
	dest, err := os.Readlink(target)
	if err != nil {
		return err
	}
	if !samePath(dest, want) {
		return fmt.Errorf("%s links to %s, want %s", target, dest, want)
	}
	return nil
}

func samePath(a, b string) bool {
	clean := func(p string) string {
		p = strings.TrimPrefix(strings.TrimPrefix(p, `\\?\`), `\??\`)
		return strings.ToLower(strings.TrimRight(filepath.Clean(p), `\`))
	}
	return clean(a) == clean(b)
}

func gone(paths ...string) error {
	var errs []error
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("%s still exists (%v)", p, err))
		}
	}
	return errors.Join(errs...)
}

func stats(ctx context.Context, k *drivertest.Kubelet, pod *drivertest.Pod, vol string) (*csi.VolumeUsage, error) {
	resp, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{
		VolumeId: api.VolumeHandle(pod.UID, vol), VolumePath: k.TargetPath(pod, vol)})
	if err != nil {
		return nil, err
	}
	for _, u := range resp.GetUsage() {
		if u.GetUnit() == csi.VolumeUsage_BYTES {
			return u, nil
		}
	}
	return nil, errors.New("no byte usage reported")
}

func testDir(ctx context.Context, k *drivertest.Kubelet, dirRoot string) {
	pod := k.NewPod("wintest", "dir")
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"backend": "dir"}}
	target := k.TargetPath(pod, vol.Name)
	backing := filepath.Join(dirRoot, api.VolumeHandle(pod.UID, vol.Name))
	if !result("dir: publish", k.Publish(ctx, pod, vol), target) {
		return
	}
	result("dir: target is a directory link to the backing dir", checkLink(target, backing), backing)
	err := os.WriteFile(filepath.Join(target, "hello.txt"), []byte("hello"), 0o644)
	if err == nil {
		var b []byte
		b, err = os.ReadFile(filepath.Join(backing, "hello.txt"))
		if err == nil && string(b) != "hello" {
			err = fmt.Errorf("read %q through the backing dir", b)
		}
	}
	result("dir: data written through the link lands in the backing dir", err, "")
	result("dir: republish is idempotent", k.Republish(ctx, pod, vol.Name), "")
	u, err := stats(ctx, k, pod, vol.Name)
	if err == nil && u.GetUsed() < 5 {
		err = fmt.Errorf("used %d bytes, want at least the 5 written", u.GetUsed())
	}
	result("dir: NodeGetVolumeStats", err, fmt.Sprintf("%+v", u))
	result("dir: unpublish", k.Unpublish(ctx, pod, vol.Name), "")
	result("dir: nothing left (link, target dir, backing dir)", gone(target, filepath.Dir(target), backing), "")
}

func testVHDX(ctx context.Context, k *drivertest.Kubelet, stateDir string, size int64) {
	pod := k.NewPod("wintest", "vhdx")
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"backend": "vhdx", "size": fmt.Sprintf("%dMi", size>>20)}}
	id := api.VolumeHandle(pod.UID, vol.Name)
	target := k.TargetPath(pod, vol.Name)
	file := filepath.Join(stateDir, "vhdx", id+".vhdx")
	mnt := filepath.Join(stateDir, "vhdx", "mnt", id)
	start := time.Now()
	if !result("vhdx: publish", k.Publish(ctx, pod, vol), fmt.Sprintf("%s in %v", target, time.Since(start).Round(time.Millisecond))) {
		return
	}
	result("vhdx: target is a directory link to the mount folder", checkLink(target, mnt), mnt)
	fi, err := os.Stat(file)
	if err == nil && fi.Size() < size {
		err = fmt.Errorf("%s is %d bytes, want a fixed-size file of at least %d", file, fi.Size(), size)
	}
	result("vhdx: fixed-size VHDX file", err, file)
	result("vhdx: mount folder is a volume root", volumeRoot(mnt), mnt)
	u, err := stats(ctx, k, pod, vol.Name)
	if err == nil && (u.GetTotal() > size || u.GetTotal() < size*8/10) {
		err = fmt.Errorf("total %d bytes, want within 80%%-100%% of %d", u.GetTotal(), size)
	}
	result("vhdx: NodeGetVolumeStats reports the volume's size", err, fmt.Sprintf("%+v", u))
	result("vhdx: small write", os.WriteFile(filepath.Join(target, "small.txt"), []byte("small"), 0o644), "")
	written, err := fill(filepath.Join(target, "fill.bin"), size+(16<<20))
	if err == nil {
		result("vhdx: write past the size fails", fmt.Errorf("wrote %d bytes into a %d-byte volume", written, size), "")
	} else {
		result("vhdx: write past the size fails", nil, fmt.Sprintf("after %d bytes: %v", written, err))
	}
	result("vhdx: unpublish", k.Unpublish(ctx, pod, vol.Name), "")
	result("vhdx: nothing left (link, target dir, VHDX file, mount folder)", gone(target, filepath.Dir(target), file, mnt), "")
	result("vhdx: VHDX detached", detached(file), "")
}

// fill writes up to n bytes in 1MiB chunks and returns how much was written
// and the first error.
func fill(path string, n int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var written int64
	for written < n {
		m, err := f.Write(buf)
		written += int64(m)
		if err != nil {
			return written, err
		}
	}
	return written, f.Sync()
}
