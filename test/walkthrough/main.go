//go:build linux

// Command walkthrough is what `make run` shows: it starts the scratch driver
// binary with its state under a work directory, then plays the kubelet for a fake
// pod through the framework's kubelet simulator (kubelet-exact requests over the
// driver's unix socket) and shows each outcome on the real system: the mount in
// /proc/self/mountinfo with its size, a write inside the limit, a write past it
// refused with ENOSPC, the unpublish, and that no mount, directory or state record
// is left; and what the node CLI (`ephemera-scratch volumes`, without flags: it
// finds the driver) sees: the volume while published, then none. It exits
// non-zero if anything is not as expected.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

func main() {
	driverBin := flag.String("driver", "_output/bin/ephemera-scratch", "scratch driver binary")
	work := flag.String("work", "_output", "work directory for state, kubelet root and socket")
	flag.Parse()
	if err := run(*driverBin, *work); err != nil {
		fmt.Fprintf(os.Stderr, "\nwalkthrough FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nwalkthrough OK: published, enforced, unpublished, nothing left.")
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }
func show(format string, args ...any) { fmt.Printf("    "+format+"\n", args...) }

func run(driverBin, work string) error {
	if os.Geteuid() != 0 {
		return errors.New("mounting tmpfs needs root: run `sudo make run`")
	}
	work, err := filepath.Abs(work)
	if err != nil {
		return err
	}
	var (
		stateDir = filepath.Join(work, "state")
		root     = filepath.Join(work, "kubelet")
		sockDir  = filepath.Join(work, "run")
		endpoint = "unix://" + filepath.Join(sockDir, "csi.sock")
		logFile  = filepath.Join(work, "driver.log")
	)
	if err := os.MkdirAll(filepath.Join(root, "pods"), 0o750); err != nil {
		return err
	}

	metrics, err := freeLoopbackAddress()
	if err != nil {
		return err
	}
	step("Starting the scratch driver (state in %s, log in %s)", stateDir, logFile)
	drv, err := startDriver(driverBin, logFile, "--endpoint="+endpoint, "--nodeid=demo-node",
		"--state-dir="+stateDir, "--kubelet-root="+root, "--metrics-address="+metrics, "--v=2")
	if err != nil {
		return err
	}
	defer drv.stop()
	if err := waitReady(endpoint); err != nil {
		return err
	}
	show("serving on %s", endpoint)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := drivertest.NewKubelet(drivertest.KubeletOptions{Root: root, Endpoint: endpoint, DriverName: "scratch.csi.ephemera.dev", NodeName: "demo-node"})
	pod := k.NewPod("demo", "scratch-pod")
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"size": "64Mi"}}
	target := k.TargetPath(pod, "scratch")

	step("Kubelet: NodePublishVolume for pod demo/scratch-pod, volume \"scratch\" {size: 64Mi}")
	if err := k.Publish(ctx, pod, vol); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	show("target %s", target)
	infos, err := mount.ReadMountInfo()
	if err != nil {
		return err
	}
	n := mount.MountsAt(infos, target)
	for _, mi := range infos {
		if mi.MountPoint == target {
			show("mountinfo: %s on %s type %s (%s)", mi.Source, mi.MountPoint, mi.FSType, mi.SuperOptions)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return err
	}
	size := int64(st.Blocks) * st.Bsize
	show("mounts at target: %d, filesystem size: %d MiB", n, size>>20)
	if n != 1 || size != 64<<20 {
		return fmt.Errorf("want exactly one 64MiB mount, got %d mounts of %d bytes", n, size)
	}

	step("Pod writes 10 MiB into the volume")
	if err := os.WriteFile(filepath.Join(target, "data"), make([]byte, 10<<20), 0o644); err != nil {
		return fmt.Errorf("write inside the limit: %w", err)
	}
	show("ok")

	id := k.PublishRequest(pod, vol).GetVolumeId()
	step("The node CLI: %s volumes (no flags: it finds the running driver of its binary)", driverBin)
	out, err := volumesCLI(driverBin)
	if err != nil {
		return err
	}
	if !strings.Contains(out, id[:16]) || !strings.Contains(out, "scratch-pod") || !strings.Contains(out, "64Mi") {
		return fmt.Errorf("the CLI does not list volume %s of demo/scratch-pod", id[:16])
	}

	step("Pod tries to write 80 MiB more: past the 64Mi limit")
	err = os.WriteFile(filepath.Join(target, "too-much"), make([]byte, 80<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("write past the limit: got %v, want ENOSPC", err)
	}
	show("refused: %v", err)

	step("Kubelet restarts and sends the same NodePublishVolume again")
	if err := k.Restart(ctx); err != nil {
		return err
	}
	infos, _ = mount.ReadMountInfo()
	show("mounts at target: %d (idempotent, nothing stacked)", mount.MountsAt(infos, target))

	step("Pod is deleted: NodeUnpublishVolume")
	if err := k.DeletePod(ctx, pod); err != nil {
		return fmt.Errorf("unpublish: %w", err)
	}
	infos, _ = mount.ReadMountInfo()
	left := mount.MountsUnder(infos, root)
	_, statErr := os.Lstat(target)
	show("mounts under kubelet root: %d, target exists: %v", len(left), statErr == nil)
	if len(left) != 0 || statErr == nil {
		return errors.New("unpublish left a mount or the target directory")
	}

	step("The node CLI again: the volume is gone")
	if out, err = volumesCLI(driverBin); err != nil {
		return err
	}
	if strings.Contains(out, id[:16]) {
		return fmt.Errorf("the CLI still lists volume %s after the unpublish", id[:16])
	}

	step("Stopping the driver and reading its bbolt state")
	if err := drv.stop(); err != nil {
		return err
	}
	if abs, err := filepath.Abs(driverBin); err == nil && filepath.Dir(filepath.Dir(abs)) == work {
		step("The node CLI with the driver stopped: it reads the state file `make run` left beside it")
		if out, err = volumesCLI(driverBin); err != nil {
			return err
		}
		if strings.Contains(out, id[:16]) {
			return fmt.Errorf("the CLI lists volume %s from the state file after the unpublish", id[:16])
		}
	}
	s, err := boltstore.Open(filepath.Join(stateDir, framework.StateFile), boltstore.Options{Timeout: time.Second})
	if err != nil {
		return err
	}
	defer s.Close()
	recs, err := s.List(ctx)
	if err != nil {
		return err
	}
	show("volume records in %s: %d", filepath.Join(stateDir, framework.StateFile), len(recs))
	if len(recs) != 0 {
		return fmt.Errorf("%d records left", len(recs))
	}
	return nil
}

// volumesCLI runs `bin volumes` as an operator would, without flags, shows
// what it prints (where it looked, then the table) and returns the table.
func volumesCLI(bin string) (string, error) {
	cmd := exec.Command(bin, "volumes")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()+stdout.String()), "\n") {
		show("%s", l)
	}
	if err != nil {
		return "", fmt.Errorf("%s volumes: %w", bin, err)
	}
	return stdout.String(), nil
}

// freeLoopbackAddress returns a loopback address with a port nothing listens
// on now, for the driver's --metrics-address (the node CLI asks it).
func freeLoopbackAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

type driver struct {
	cmd  *exec.Cmd
	done chan error
}

func startDriver(bin, logFile string, args ...string) (*driver, error) {
	lf, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w (run `make build` first)", bin, err)
	}
	d := &driver{cmd: cmd, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait(); lf.Close() }()
	return d, nil
}

// stop sends SIGTERM and waits; calling it again is harmless.
func (d *driver) stop() error {
	if d.cmd.ProcessState != nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		return err
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		return errors.New("driver did not stop within 15s of SIGTERM")
	}
}

func waitReady(endpoint string) error {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := id.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("driver not ready after 15s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
