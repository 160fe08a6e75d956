//go:build linux

package framework_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

func usage(t *testing.T, resp *csi.NodeGetVolumeStatsResponse, unit csi.VolumeUsage_Unit) *csi.VolumeUsage {
	t.Helper()
	for _, u := range resp.GetUsage() {
		if u.Unit == unit {
			return u
		}
	}
	t.Fatalf("no %v usage in %v", unit, resp)
	return nil
}

// legacyCondition decodes volume_condition (field 2) the way a kubelet built
// against CSI 1.12 does.
func legacyCondition(t *testing.T, resp *csi.NodeGetVolumeStatsResponse) (abnormal bool, msg string) {
	t.Helper()
	raw := resp.ProtoReflect().GetUnknown()
	num, typ, n := protowire.ConsumeTag(raw)
	if n < 0 || num != 2 || typ != protowire.BytesType {
		t.Fatalf("no volume_condition field in %x", raw)
	}
	cond, m := protowire.ConsumeBytes(raw[n:])
	if m < 0 {
		t.Fatal("bad volume_condition")
	}
	for len(cond) > 0 {
		num, typ, n := protowire.ConsumeTag(cond)
		cond = cond[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(cond)
			abnormal, cond = v == 1, cond[n:]
		case num == 2 && typ == protowire.BytesType:
			s, n := protowire.ConsumeString(cond)
			msg, cond = s, cond[n:]
		default:
			t.Fatalf("unexpected field %d", num)
		}
	}
	return abnormal, msg
}

func TestVolumeStatsAndHealth(t *testing.T) {
	h := realHarness(t, nil)
	k, ctx := h.Kubelet, t.Context()
	caps, err := h.Node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range caps.Capabilities {
		names = append(names, c.GetRpc().GetType().String())
	}
	if got := strings.Join(names, ","); got != "GET_VOLUME_STATS,GET_VOLUME_HEALTH,4,VOLUME_MOUNT_GROUP" {
		t.Errorf("capabilities = %s", got)
	}

	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "t", Attributes: map[string]string{"size": "4Mi"}}); err != nil {
		t.Fatal(err)
	}
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "d", Attributes: map[string]string{"backend": "dir"}}); err != nil {
		t.Fatal(err)
	}
	tmpfsTarget, dirTarget := k.TargetPath(pod, "t"), k.TargetPath(pod, "d")
	if err := os.WriteFile(filepath.Join(tmpfsTarget, "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirTarget, "f"), make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dirTarget, "sub"), 0o755)

	stats := func(name string) *csi.NodeGetVolumeStatsResponse {
		t.Helper()
		resp, err := h.Node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: api.VolumeHandle(pod.UID, name), VolumePath: k.TargetPath(pod, name)})
		if err != nil {
			t.Fatalf("stats %s: %v", name, err)
		}
		return resp
	}
	ts := stats("t")
	if b := usage(t, ts, csi.VolumeUsage_BYTES); b.Total != 4<<20 || b.Used < 1<<20 || b.Used > 2<<20 || b.Available != b.Total-b.Used {
		t.Errorf("tmpfs bytes = %+v", b)
	}
	if i := usage(t, ts, csi.VolumeUsage_INODES); i.Used < 2 || i.Total == 0 {
		t.Errorf("tmpfs inodes = %+v", i)
	}
	if abnormal, msg := legacyCondition(t, ts); abnormal {
		t.Errorf("healthy tmpfs reported abnormal: %s", msg)
	}
	ds := stats("d")
	if b := usage(t, ds, csi.VolumeUsage_BYTES); b.Used < 3<<20 || b.Used > 4<<20 {
		t.Errorf("dir bytes used = %d, want about 3MiB (du of the volume, not the host filesystem)", b.Used)
	}
	if i := usage(t, ds, csi.VolumeUsage_INODES); i.Used != 3 {
		t.Errorf("dir inodes used = %d, want 3 (root, f, sub)", i.Used)
	}

	// Unmounted behind the driver's back: abnormal, in both APIs, no usage.
	if err := syscall.Unmount(tmpfsTarget, 0); err != nil {
		t.Fatal(err)
	}
	ts = stats("t")
	if abnormal, msg := legacyCondition(t, ts); !abnormal || !strings.Contains(msg, "not mounted") || len(ts.Usage) != 0 {
		t.Errorf("unmounted volume: abnormal=%v msg=%q usage=%v", abnormal, msg, ts.Usage)
	}
	hr, err := h.Node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: api.VolumeHandle(pod.UID, "t")})
	if err != nil || len(hr.VolumeHealth.HealthStatuses) != 1 || hr.VolumeHealth.HealthStatuses[0].Reason != "NotMounted" {
		t.Errorf("health of unmounted volume = %v, %v", hr, err)
	}
	hr, err = h.Node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: api.VolumeHandle(pod.UID, "d")})
	if err != nil || len(hr.VolumeHealth.HealthStatuses) != 0 || hr.VolumeHealth.VolumeId != api.VolumeHandle(pod.UID, "d") {
		t.Errorf("health of healthy volume = %v, %v", hr, err)
	}

	for name, tc := range map[string]struct {
		req  *csi.NodeGetVolumeStatsRequest
		code codes.Code
	}{
		"unknown volume": {&csi.NodeGetVolumeStatsRequest{VolumeId: "csi-0", VolumePath: "some/path"}, codes.NotFound},
		"missing id":     {&csi.NodeGetVolumeStatsRequest{VolumePath: dirTarget}, codes.InvalidArgument},
		"missing path":   {&csi.NodeGetVolumeStatsRequest{VolumeId: api.VolumeHandle(pod.UID, "d")}, codes.InvalidArgument},
		"other's target": {&csi.NodeGetVolumeStatsRequest{VolumeId: api.VolumeHandle(pod.UID, "d"), VolumePath: tmpfsTarget}, codes.NotFound},
	} {
		if _, err := h.Node.NodeGetVolumeStats(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", name, err, tc.code)
		}
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

func TestCapacityBudget(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) { o.Limits.Capacity = map[string]int64{"tmpfs": 5 << 20} })
	k, ctx := h.Kubelet, t.Context()
	a, b, c := k.NewPod("ns", "a"), k.NewPod("ns", "b"), k.NewPod("ns", "c")
	vol := func(size string) drivertest.InlineVolume {
		return drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": size}}
	}
	if err := k.Publish(ctx, a, vol("2Mi")); err != nil {
		t.Fatal(err)
	}
	if err := k.Publish(ctx, b, vol("2Mi")); err != nil {
		t.Fatal(err)
	}
	err := k.Publish(ctx, c, vol("2Mi"))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "4Mi of its 5Mi") || !strings.Contains(err.Error(), "2Mi more") {
		t.Fatalf("over budget: %v, want ResourceExhausted with the numbers", err)
	}
	if n := len(mountUnder(t, h.Options.Node.KubeletRootDir)); n != 2 {
		t.Fatalf("%d mounts, want 2 (the refused publish made none)", n)
	}
	// dir volumes are not in the tmpfs budget.
	if err := k.Publish(ctx, c, drivertest.InlineVolume{Name: "d", Attributes: map[string]string{"backend": "dir"}}); err != nil {
		t.Fatalf("dir volume blocked by the tmpfs budget: %v", err)
	}
	// The accounting survives a restart (it comes from the records).
	h.Restart()
	if err := k.Publish(ctx, c, vol("2Mi")); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("after restart: %v, want ResourceExhausted", err)
	}
	if err := k.DeletePod(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := k.Publish(ctx, c, vol("2Mi")); err != nil {
		t.Fatalf("after freeing 2Mi: %v", err)
	}
	for _, p := range []*drivertest.Pod{b, c} {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFSGroup(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{"conf/app.ini": {Data: []byte("x"), Mode: 0o600}}, nil
		})
	})
	k, ctx := h.Kubelet, t.Context()
	gid := int64(4321)
	pod := k.NewPod("ns", "p")
	pod.FSGroup = &gid
	for _, v := range []drivertest.InlineVolume{
		{Name: "t", Attributes: map[string]string{"size": "1Mi"}},
		{Name: "d", Attributes: map[string]string{"backend": "dir", "mode": "0700"}},
	} {
		if err := k.Publish(ctx, pod, v); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		target := k.TargetPath(pod, v.Name)
		fi, err := os.Stat(target)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Gid != uint32(gid) || fi.Mode()&os.ModeSetgid == 0 || fi.Mode().Perm()&0o070 != 0o070 {
			t.Errorf("%s root: gid %d mode %v, want gid %d, setgid, group rwx", v.Name, st.Gid, fi.Mode(), gid)
		}
		for _, p := range []string{"conf", "conf/app.ini"} {
			fi, err := os.Stat(filepath.Join(target, p))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Sys().(*syscall.Stat_t).Gid != uint32(gid) || fi.Mode().Perm()&0o040 == 0 {
				t.Errorf("%s/%s: gid %d mode %v, want group %d readable", v.Name, p, fi.Sys().(*syscall.Stat_t).Gid, fi.Mode(), gid)
			}
		}
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// Loop volumes: ext4 and xfs both publish, enforce their size and report
// statfs-based stats through the driver.
func TestLoopFilesystemsStats(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) {
		b, err := loop.New(loop.Options{Dir: filepath.Join(o.Node.StateDir, "loop")})
		if err != nil {
			t.Fatal(err)
		}
		o.Backends["loop"] = b
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "p")
	// A failure half-way (mkfs.xfs missing, say) still detaches the ext4
	// volume's loop device: this runs before the harness stops the driver.
	t.Cleanup(func() {
		if err := k.DeletePod(context.Background(), pod); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for _, tc := range []struct {
		fsType string
		size   int64
		vol    drivertest.InlineVolume
	}{
		{"ext4", 32 << 20, drivertest.InlineVolume{Name: "e", Attributes: map[string]string{"backend": "loop", "size": "32Mi"}}},
		{"xfs", 300 << 20, drivertest.InlineVolume{Name: "x", FSType: "xfs", Attributes: map[string]string{"backend": "loop", "size": "300Mi"}}},
	} {
		if err := k.Publish(ctx, pod, tc.vol); err != nil {
			t.Fatalf("%s: %v", tc.fsType, err)
		}
		target := k.TargetPath(pod, tc.vol.Name)
		if got := fsTypeAt(t, target); got != tc.fsType {
			t.Fatalf("mounted %q, want %s", got, tc.fsType)
		}
		err := os.WriteFile(filepath.Join(target, "big"), make([]byte, tc.size+(1<<20)), 0o644)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("%s: writing past the size: %v, want ENOSPC", tc.fsType, err)
		}
		os.Remove(filepath.Join(target, "big"))
		if err := os.WriteFile(filepath.Join(target, "f"), make([]byte, 4<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		resp, err := h.Node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: api.VolumeHandle(pod.UID, tc.vol.Name), VolumePath: target})
		if err != nil {
			t.Fatal(err)
		}
		b := usage(t, resp, csi.VolumeUsage_BYTES)
		if b.Total <= 0 || b.Total > tc.size || b.Used < 4<<20 || b.Available <= 0 {
			t.Errorf("%s bytes = %+v (size %d)", tc.fsType, b, tc.size)
		}
		if i := usage(t, resp, csi.VolumeUsage_INODES); i.Total == 0 || i.Used == 0 {
			t.Errorf("%s inodes = %+v", tc.fsType, i)
		}
		if abnormal, msg := legacyCondition(t, resp); abnormal {
			t.Errorf("%s abnormal: %s", tc.fsType, msg)
		}
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if ids, _ := h.Options.Backends["loop"].(framework.Lister).List(ctx); len(ids) != 0 {
		t.Errorf("loop storage left: %v", ids)
	}
}

// An 8EiB tmpfs (size 2^63-2, rounded up to pages by the kernel) has 2^51
// blocks of 4KiB, 2^63 bytes: one more than int64 holds. The stats saturate
// instead of wrapping negative.
func TestVolumeStatsHugeTmpfs(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) { o.Limits.MaxVolumeSize = framework.NoMaxVolumeSize })
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "t", Attributes: map[string]string{"size": "9223372036854775806"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.TargetPath(pod, "t"), "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	resp, err := h.Node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: api.VolumeHandle(pod.UID, "t"), VolumePath: k.TargetPath(pod, "t")})
	if err != nil {
		t.Fatal(err)
	}
	b := usage(t, resp, csi.VolumeUsage_BYTES)
	if b.Total != math.MaxInt64 || b.Used < 1<<20 || b.Used > 2<<20 || b.Available <= 0 || b.Available > b.Total {
		t.Errorf("bytes of an 8EiB tmpfs = %+v, want total saturated at %d, used about 1MiB, available in (0, total]", b, int64(math.MaxInt64))
	}
	if i := usage(t, resp, csi.VolumeUsage_INODES); i.Total <= 0 || i.Used < 2 || i.Available < 0 {
		t.Errorf("inodes = %+v", i)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}
