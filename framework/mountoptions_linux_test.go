package framework_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// An operator's mount options apply to every volume of their backend, on the
// real kernel: a tmpfs (fsmount) and a dir volume (a bind, mount_setattr)
// show their options in the mount table beside nosuid and nodev, and a
// binary copied into them cannot be executed (EACCES). (Pods cannot set mount options: an inline volume has
// no mountOptions, and mount flags in a request are refused, TestPublishValidation.)
func TestOperatorMountOptions(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) {
		o.Volumes.MountOptions = map[string][]string{"tmpfs": {"noexec", "noatime"}, "dir": {"noexec", "nosymfollow"}}
	})
	k := h.Kubelet
	pod := k.NewPod("ns", "opts")
	vols := []drivertest.InlineVolume{
		{Name: "mem", Attributes: map[string]string{"size": "16Mi"}},
		{Name: "dir", Attributes: map[string]string{"backend": "dir"}},
	}
	for _, v := range vols {
		if err := k.Publish(t.Context(), pod, v); err != nil {
			t.Fatalf("publish %s: %v", v.Name, err)
		}
	}
	want := map[string][]string{"mem": {"noexec", "noatime", "nosuid", "nodev"}, "dir": {"noexec", "nosymfollow", "nosuid", "nodev"}}
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		target := k.TargetPath(pod, v.Name)
		i := slices.IndexFunc(infos, func(mi mount.MountInfo) bool { return mi.MountPoint == target })
		if i < 0 {
			t.Fatalf("%s is not in the mount table", target)
		}
		opts := strings.Split(infos[i].Options, ",")
		for _, o := range want[v.Name] {
			if !slices.Contains(opts, o) {
				t.Errorf("volume %s mounted %s, want %s among them", v.Name, infos[i].Options, o)
			}
		}
		p := filepath.Join(target, "true")
		if err := os.WriteFile(p, bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := exec.Command(p).Run(); !errors.Is(err, syscall.EACCES) {
			t.Errorf("exec from the noexec volume %s: %v, want EACCES", v.Name, err)
		}
	}
	if err := k.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}

// Options outside the safe list, twice, or two atime modes are refused when
// the driver is made, naming them.
func TestOperatorMountOptionsChecked(t *testing.T) {
	for opts, want := range map[string]string{
		"suid":             `"suid" is not one of noexec`,
		"noexec,noexec":    `"noexec" is given twice`,
		"noatime,relatime": `"noatime" and "relatime" exclude each other`,
	} {
		_, err := framework.New(framework.Options{
			DriverName: "t.csi.ephemera.dev",
			Backends:   map[string]framework.Backend{"b": framework.BackendFuncs{}},
			Node: framework.NodeOptions{
				ID:             "n",
				StateDir:       t.TempDir(),
				KubeletRootDir: t.TempDir(),
			},
			Volumes: framework.VolumeOptions{MountOptions: map[string][]string{"b": strings.Split(opts, ",")}},
		})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("MountOptions %s: %v, want %q", opts, err, want)
		}
	}
	_, err := framework.New(framework.Options{
		DriverName: "t.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"b": framework.BackendFuncs{}},
		Node: framework.NodeOptions{
			ID:             "n",
			StateDir:       t.TempDir(),
			KubeletRootDir: t.TempDir(),
		},
		Volumes: framework.VolumeOptions{MountOptions: map[string][]string{"c": {"noexec"}}},
	})
	if err == nil || !strings.Contains(err.Error(), `MountOptions: "c" is not one of the backends (b)`) {
		t.Errorf("MountOptions of an unknown backend: %v", err)
	}
}
