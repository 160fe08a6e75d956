package mount

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

func TestFakeLifecycle(t *testing.T) {
	root := abs("/var/lib/kubelet")
	parent := filepath.Join(root, "pods", "u", "volumes", "kubernetes.io~csi", "v")
	target := filepath.Join(parent, "mount")
	f := NewFake()

	if err := f.MakeTarget(root, target); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("MakeTarget without parent: %v, want ErrNotExist", err)
	}
	f.AddDir(parent)
	if err := f.MakeTarget(root, target); err != nil {
		t.Fatal(err)
	}
	if !f.DirExists(target) {
		t.Fatal("target not created")
	}
	src := api.Source{Path: "tmpfs", FSType: "tmpfs", Options: []string{"size=1m"}}
	if err := f.Mount(root, src, target); err != nil {
		t.Fatal(err)
	}
	src.Options[0] = "size=2m" // the fake keeps its own copy
	if err := f.Mount(root, api.Source{Path: abs("/data")}, target); !errors.Is(err, ErrMounted) {
		t.Fatalf("Mount over a mount: %v, want ErrMounted", err)
	}
	f.AddMount(target, api.Source{Path: abs("/data")}) // what an older driver stacked
	if n := f.MountCount(target); n != 2 {
		t.Errorf("MountCount = %d, want 2 (a double mount must be observable)", n)
	}
	if got := f.Mounts(target); got[0].Options[0] != "size=1m" || got[1].Path != abs("/data") {
		t.Errorf("Mounts = %+v", got)
	}
	if got := f.MountedTargets(); !slices.Equal(got, []string{target}) {
		t.Errorf("MountedTargets = %v", got)
	}
	if ok, err := f.IsMountPoint(root, target); !ok || err != nil {
		t.Errorf("IsMountPoint = %v, %v", ok, err)
	}
	if err := f.SetReadOnly(root, target, true); err != nil || !f.IsReadOnly(target) {
		t.Errorf("SetReadOnly: %v, IsReadOnly %v", err, f.IsReadOnly(target))
	}
	if err := f.RemoveTarget(root, target); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("RemoveTarget while mounted: %v, want EBUSY", err)
	}
	if err := f.Unmount(root, target); err != nil {
		t.Fatal(err)
	}
	if n := f.MountCount(target); n != 0 || f.IsReadOnly(target) {
		t.Errorf("after Unmount: MountCount %d, IsReadOnly %v", n, f.IsReadOnly(target))
	}
	if err := f.Unmount(root, target); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
	if err := f.RemoveTarget(root, target); err != nil || f.DirExists(target) {
		t.Errorf("RemoveTarget: %v, exists %v", err, f.DirExists(target))
	}
	if err := f.RemoveTarget(root, target); err != nil {
		t.Errorf("RemoveTarget(missing): %v", err)
	}
	if err := f.RemoveTarget(root, filepath.Join(root, "no", "such")); err != nil {
		t.Errorf("RemoveTarget(missing parent): %v", err)
	}
	f.AddDir(target)
	if err := f.RemoveTarget(root, parent); !errors.Is(err, syscall.ENOTEMPTY) || !f.DirExists(parent) {
		t.Errorf("RemoveTarget(non-empty): %v, want ENOTEMPTY", err)
	}

	want := []string{
		"MakeTarget " + target, "MakeTarget " + target, "Mount " + target, "Mount " + target,
		"IsMountPoint " + target, "SetReadOnly " + target, "RemoveTarget " + target,
		"Unmount " + target, "Unmount " + target, "RemoveTarget " + target, "RemoveTarget " + target,
		"RemoveTarget " + filepath.Join(root, "no", "such"), "RemoveTarget " + parent,
	}
	if got := f.Calls(); !slices.Equal(got, want) {
		t.Errorf("Calls:\n got %q\nwant %q", got, want)
	}
	f.ResetCalls()
	if len(f.Calls()) != 0 {
		t.Error("ResetCalls left calls")
	}
}

func TestFakeErrors(t *testing.T) {
	root := abs("/r")
	target := filepath.Join(root, "t")
	var f Fake // the zero value works
	if err := f.Mount(root, api.Source{Path: abs("/d")}, target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Mount on a missing target: %v, want ErrNotExist", err)
	}
	if err := f.SetReadOnly(root, target, true); err == nil {
		t.Error("SetReadOnly of an unmounted target succeeded")
	}
	for _, bad := range []string{root, abs("/elsewhere/t"), abs("/r/../t")} {
		if err := f.MakeTarget(root, bad); err == nil {
			t.Errorf("MakeTarget(%s) outside root succeeded", bad)
		}
	}
	f.AddSymlink(filepath.Join(root, "link"))
	if err := f.MakeTarget(root, filepath.Join(root, "link", "t")); !errors.Is(err, ErrSymlink) {
		t.Errorf("MakeTarget through a link: %v, want ErrSymlink", err)
	}
	if err := f.MakeTarget(root, filepath.Join(root, "link")); !errors.Is(err, ErrSymlink) {
		t.Errorf("MakeTarget on a link: %v, want ErrSymlink", err)
	}

	boom := errors.New("boom")
	f.Fail(MethodMount, func(t string) error {
		if t == target {
			return boom
		}
		return nil
	})
	if err := f.MakeTarget(root, target); err != nil {
		t.Fatal(err)
	}
	if err := f.Mount(root, api.Source{Path: abs("/d")}, target); !errors.Is(err, boom) {
		t.Errorf("injected Mount error: %v", err)
	}
	if f.MountCount(target) != 0 {
		t.Error("a failed Mount changed state")
	}
	f.Fail(MethodMount, nil)
	if err := f.Mount(root, api.Source{Path: abs("/d")}, target); err != nil {
		t.Errorf("Mount after clearing the injection: %v", err)
	}
	f.Fail(MethodUnmount, func(string) error { return fmt.Errorf("unmount: %w", syscall.EBUSY) })
	if err := f.Unmount(root, target); !errors.Is(err, syscall.EBUSY) || f.MountCount(target) != 1 {
		t.Errorf("injected Unmount error: %v, MountCount %d", err, f.MountCount(target))
	}
	f.Fail(MethodIsMountPoint, func(string) error { return boom })
	if _, err := f.IsMountPoint(root, target); !errors.Is(err, boom) {
		t.Errorf("injected IsMountPoint error: %v", err)
	}

	defer func() {
		if recover() == nil {
			t.Error("Fail with an unknown method did not panic")
		}
	}()
	f.Fail("Mnt", nil)
}

func TestFakeConcurrent(t *testing.T) {
	root := abs("/r")
	f := NewFake()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			target := filepath.Join(root, fmt.Sprint(i))
			for range 50 {
				_ = f.MakeTarget(root, target)
				_ = f.Mount(root, api.Source{Path: abs("/d")}, target)
				_, _ = f.IsMountPoint(root, target)
				_ = f.SetReadOnly(root, target, true)
				_ = f.Unmount(root, target)
				_ = f.RemoveTarget(root, target)
				_ = f.Calls()
			}
		})
	}
	wg.Wait()
	if got := len(f.Calls()); got != 16*50*6 {
		t.Errorf("%d calls logged, want %d", got, 16*50*6)
	}
	if len(f.MountedTargets()) != 0 {
		t.Errorf("mounts left: %v", f.MountedTargets())
	}
}

// An injected function may block one call without blocking the others, and may
// call the Fake.
func TestFakeFailBlocks(t *testing.T) {
	root := abs("/r")
	f := NewFake()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	entered, release := make(chan struct{}), make(chan struct{})
	f.Fail(MethodMount, func(target string) error {
		_ = f.MountCount(target)
		if target == a {
			close(entered)
			<-release
		}
		return nil
	})
	for _, tg := range []string{a, b} {
		if err := f.MakeTarget(root, tg); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error)
	go func() { done <- f.Mount(root, api.Source{Path: abs("/d")}, a) }()
	<-entered
	if err := f.Mount(root, api.Source{Path: abs("/d")}, b); err != nil {
		t.Fatal(err)
	}
	if ok, _ := f.IsMountPoint(root, a); ok {
		t.Error("a mounted before its Mount returned")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if f.MountCount(a) != 1 || f.MountCount(b) != 1 {
		t.Errorf("MountCount a=%d b=%d", f.MountCount(a), f.MountCount(b))
	}
}
