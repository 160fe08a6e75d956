package drivertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ephemera-csi/ephemera/api"
)

func TestKubeletNewPod(t *testing.T) {
	k, _ := newTestKubelet(t, KubeletOptions{})
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 50 {
		p := k.NewPod("ns", "p")
		if !uuidRE.MatchString(p.UID) {
			t.Fatalf("UID %q is not a UUID v4", p.UID)
		}
		if seen[p.UID] {
			t.Fatalf("duplicate UID %q", p.UID)
		}
		seen[p.UID] = true
		if p.ServiceAccount != "default" || p.Namespace != "ns" || p.Name != "p" {
			t.Fatalf("pod = %+v", p)
		}
		fi, err := os.Stat(filepath.Join(k.Root(), "pods", p.UID))
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&^0o750 != 0 {
			t.Fatalf("pod dir: %v %v", fi, err)
		}
	}
	p := k.NewPod("ns", "p")
	want := filepath.Join(k.Root(), "pods", p.UID, "volumes", "kubernetes.io~csi", "v", "mount")
	if got := k.TargetPath(p, "v"); got != want {
		t.Fatalf("TargetPath = %q, want %q", got, want)
	}
}

func TestKubeletPublishRequest(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{NodeName: "n1"})
	pod := k.NewPod("team", "web")
	pod.FSGroup = kptr(int64(1234)) // not passed: no VOLUME_MOUNT_GROUP
	vol := InlineVolume{
		Name:       "data",
		ReadOnly:   true,
		FSType:     "ext4",
		Attributes: map[string]string{"size": "64Mi", api.KeyPodName: "forged", api.KeyEphemeral: "false"},
		Secrets:    map[string]string{"password": "s3cret"},
	}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	handle := api.VolumeHandle(pod.UID, "data")
	wantCalls := []string{"NodeGetCapabilities", "NodeGetCapabilities", "NodePublishVolume " + handle}
	if got := k.Calls(); !slices.Equal(got, wantCalls) {
		t.Fatalf("calls = %q, want %q", got, wantCalls)
	}
	if k.CapabilityCalls() != 2 {
		t.Fatalf("CapabilityCalls = %d", k.CapabilityCalls())
	}
	if n := d.accepts.Load(); n != 3 {
		t.Fatalf("driver accepted %d connections, want one per RPC (3)", n)
	}
	d.mu.Lock()
	auth := slices.Clone(d.authorities)
	d.mu.Unlock()
	for _, a := range auth {
		if a != "localhost" {
			t.Fatalf("authority %q, want localhost", a)
		}
	}

	want := &csi.NodePublishVolumeRequest{
		VolumeId:   handle,
		TargetPath: filepath.Join(k.Root(), "pods", pod.UID, "volumes/kubernetes.io~csi/data/mount"),
		Readonly:   true,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		VolumeContext: map[string]string{
			"size":                                   "64Mi",
			"csi.storage.k8s.io/pod.name":            "web",
			"csi.storage.k8s.io/pod.namespace":       "team",
			"csi.storage.k8s.io/pod.uid":             pod.UID,
			"csi.storage.k8s.io/serviceAccount.name": "default",
			"csi.storage.k8s.io/ephemeral":           "true",
		},
		Secrets: map[string]string{"password": "s3cret"},
	}
	got := d.gotPublishes()
	if len(got) != 1 {
		t.Fatalf("%d publishes", len(got))
	}
	if !proto.Equal(got[0], want) {
		t.Fatalf("request =\n%v\nwant\n%v", got[0], want)
	}
	if local := k.PublishRequest(pod, vol); !proto.Equal(local, want) {
		t.Fatalf("PublishRequest =\n%v\nwant\n%v", local, want)
	}
	if vol.Attributes[api.KeyPodName] != "forged" {
		t.Fatal("Publish modified the caller's attributes")
	}
	if !kpathExists(want.TargetPath) || k.State(pod, "data") != StateMounted {
		t.Fatalf("target missing or state %v", k.State(pod, "data"))
	}

	// No secret reference: secrets is an empty, non-nil map.
	req := k.PublishRequest(pod, InlineVolume{Name: "x"})
	if req.Secrets == nil || len(req.Secrets) != 0 {
		t.Fatalf("secrets = %#v, want empty non-nil map", req.Secrets)
	}
	if req.StagingTargetPath != "" || req.PublishContext != nil || req.VolumeCapability.GetMount().GetMountFlags() != nil {
		t.Fatalf("unexpected fields in %v", req)
	}
}

func TestKubeletPodInfoOnMountOff(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{PodInfoOnMount: kptr(false)})
	pod := k.NewPod("team", "web")
	vol := InlineVolume{Name: "v", Attributes: map[string]string{api.KeyPodName: "user-value", "a": "b"}}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	got := d.gotPublishes()[0].GetVolumeContext()
	want := map[string]string{api.KeyPodName: "user-value", "a": "b"}
	if !maps.Equal(got, want) {
		t.Fatalf("volume_context = %v, want %v", got, want)
	}
	for _, key := range []string{api.KeyPodNamespace, api.KeyPodUID, api.KeyServiceAccountName, api.KeyEphemeral} {
		if _, ok := got[key]; ok {
			t.Fatalf("key %s present without podInfoOnMount", key)
		}
	}
	if s := d.gotPublishes()[0].GetSecrets(); len(s) != 0 {
		t.Fatalf("secrets = %v", s)
	}
}

func TestKubeletTokens(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{PodInfoOnMount: kptr(false)})
	pod := k.NewPod("ns", "p")
	tokens := `{"aud":{"token":"t","expirationTimestamp":"2030-01-01T00:00:00Z"}}`
	if err := k.Publish(ctx, pod, InlineVolume{Name: "a", Tokens: tokens, Attributes: map[string]string{api.KeyServiceAccountTokens: "forged"}}); err != nil {
		t.Fatal(err)
	}
	if err := k.Publish(ctx, pod, InlineVolume{Name: "b", Tokens: tokens, TokensInSecrets: true, Secrets: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	got := d.gotPublishes()
	if v := got[0].GetVolumeContext()[api.KeyServiceAccountTokens]; v != tokens {
		t.Fatalf("context tokens = %q", v)
	}
	if _, ok := got[0].GetSecrets()[api.KeyServiceAccountTokens]; ok {
		t.Fatal("tokens in secrets without TokensInSecrets")
	}
	if _, ok := got[1].GetVolumeContext()[api.KeyServiceAccountTokens]; ok {
		t.Fatal("tokens in volume_context with TokensInSecrets")
	}
	if want := map[string]string{"k": "v", api.KeyServiceAccountTokens: tokens}; !maps.Equal(got[1].GetSecrets(), want) {
		t.Fatalf("secrets = %v", got[1].GetSecrets())
	}
}

func TestKubeletCapabilitiesSwitch(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	d.set(func(d *kfakeDriver) {
		d.caps = []csi.NodeServiceCapability_RPC_Type{
			csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
			csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		}
	})
	withGroup := k.NewPod("ns", "g")
	withGroup.FSGroup = kptr(int64(2000))
	noGroup := k.NewPod("ns", "n")
	if err := k.Publish(ctx, withGroup, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	if err := k.Publish(ctx, noGroup, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	got := d.gotPublishes()
	if g := got[0].GetVolumeCapability().GetMount().GetVolumeMountGroup(); g != "2000" {
		t.Fatalf("volume_mount_group = %q, want 2000", g)
	}
	if g := got[1].GetVolumeCapability().GetMount().GetVolumeMountGroup(); g != "" {
		t.Fatalf("volume_mount_group = %q without fsGroup", g)
	}
	for _, r := range got {
		if m := r.GetVolumeCapability().GetAccessMode().GetMode(); m != csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER {
			t.Fatalf("access mode = %v", m)
		}
	}
	caps := []*csi.NodeServiceCapability{{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP}}}}
	req := k.PublishRequest(withGroup, InlineVolume{Name: "v"}, caps...)
	if req.GetVolumeCapability().GetMount().GetVolumeMountGroup() != "2000" ||
		req.GetVolumeCapability().GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER {
		t.Fatalf("PublishRequest with caps = %v", req)
	}
}

func TestKubeletVolData(t *testing.T) {
	ctx := context.Background()
	k, _ := newTestKubelet(t, KubeletOptions{NodeName: "worker-7"})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "cache"}); err != nil {
		t.Fatal(err)
	}
	parent := filepath.Dir(k.TargetPath(pod, "cache"))
	fi, err := os.Stat(parent)
	if err != nil || fi.Mode().Perm()&^0o750 != 0 {
		t.Fatalf("parent: %v %v", fi, err)
	}
	b, err := os.ReadFile(filepath.Join(parent, "vol_data.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	handle := api.VolumeHandle(pod.UID, "cache")
	sum := sha256.Sum256([]byte(handle + kfakeDriverName + "worker-7"))
	want := map[string]string{
		"specVolID":           "cache",
		"volumeHandle":        handle,
		"driverName":          kfakeDriverName,
		"nodeName":            "worker-7",
		"attachmentID":        "csi-" + hex.EncodeToString(sum[:]),
		"volumeLifecycleMode": "Ephemeral",
	}
	if !maps.Equal(got, want) {
		t.Fatalf("vol_data.json = %v, want %v", got, want)
	}
	if len(handle) != 68 {
		t.Fatalf("handle %q", handle)
	}
}

func TestKubeletFinalError(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	d.set(func(d *kfakeDriver) { d.publishErr = codes.InvalidArgument })
	pod := k.NewPod("ns", "p")
	err := k.Publish(ctx, pod, InlineVolume{Name: "v"})
	if status.Code(err) != codes.InvalidArgument || !IsFinal(err) {
		t.Fatalf("err = %v", err)
	}
	parent := filepath.Dir(k.TargetPath(pod, "v"))
	if kpathExists(filepath.Join(parent, "vol_data.json")) || kpathExists(parent) {
		t.Fatal("volume dir or vol_data.json left after a final error")
	}
	if s := k.State(pod, "v"); s != StateNone {
		t.Fatalf("state = %v", s)
	}
	// The kubelet never unpublishes a volume that failed finally.
	d.set(func(d *kfakeDriver) { d.publishErr = codes.OK })
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if n := len(d.gotUnpublishes()); n != 0 {
		t.Fatalf("%d unpublishes after a final error", n)
	}
	if kpathExists(k.PodDir(pod)) {
		t.Fatal("pod dir left")
	}
}

func TestKubeletNonFinalErrorAndRestart(t *testing.T) {
	ctx := context.Background()
	for _, code := range []codes.Code{codes.Aborted, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Canceled} {
		t.Run(code.String(), func(t *testing.T) {
			k, d := newTestKubelet(t, KubeletOptions{})
			d.set(func(d *kfakeDriver) { d.publishErr = code })
			pod := k.NewPod("ns", "p")
			vol := InlineVolume{Name: "v", Attributes: map[string]string{"x": "y"}, Secrets: map[string]string{"s": "t"}}
			err := k.Publish(ctx, pod, vol)
			if status.Code(err) != code || IsFinal(err) {
				t.Fatalf("err = %v", err)
			}
			parent := filepath.Dir(k.TargetPath(pod, "v"))
			if !kpathExists(filepath.Join(parent, "vol_data.json")) {
				t.Fatal("vol_data.json removed after a non-final error")
			}
			if s := k.State(pod, "v"); s != StateUncertain {
				t.Fatalf("state = %v", s)
			}
			d.set(func(d *kfakeDriver) { d.publishErr = codes.OK })
			k.ResetCalls()
			if err := k.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			handle := api.VolumeHandle(pod.UID, "v")
			want := []string{"NodeGetCapabilities", "NodeGetCapabilities", "NodePublishVolume " + handle}
			if got := k.Calls(); !slices.Equal(got, want) {
				t.Fatalf("calls after restart = %q", got)
			}
			pubs := d.gotPublishes()
			if len(pubs) != 2 || !proto.Equal(pubs[0], pubs[1]) {
				t.Fatalf("restart request differs:\n%v\n%v", pubs[0], pubs[1])
			}
			if s := k.State(pod, "v"); s != StateMounted {
				t.Fatalf("state = %v", s)
			}
		})
	}
}

func TestKubeletUncertainThenDeletedIsUnpublished(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	d.set(func(d *kfakeDriver) { d.publishErr = codes.DeadlineExceeded })
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatal(err)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if n := len(d.gotUnpublishes()); n != 1 {
		t.Fatalf("%d unpublishes of an uncertain volume, want 1", n)
	}
}

func TestKubeletCapabilityErrors(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	pod := k.NewPod("ns", "p")
	parent := filepath.Dir(k.TargetPath(pod, "v"))

	// First NodeGetCapabilities: transient. The parent exists already (the
	// kubelet creates it first), no vol_data.json, nothing tracked.
	d.set(func(d *kfakeDriver) { d.capsErr = []codes.Code{codes.Internal} })
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); status.Code(err) != codes.Internal {
		t.Fatalf("err = %v", err)
	}
	if !kpathExists(parent) || kpathExists(filepath.Join(parent, "vol_data.json")) || k.State(pod, "v") != StateNone {
		t.Fatal("unexpected state after first capabilities failure")
	}

	// Second NodeGetCapabilities: the kubelet returns it unwrapped, so even
	// Unavailable counts as finished and the directory is cleaned up.
	d.set(func(d *kfakeDriver) { d.capsErr = []codes.Code{codes.OK, codes.Unavailable} })
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v", err)
	}
	if kpathExists(parent) || k.State(pod, "v") != StateNone {
		t.Fatal("unexpected state after second capabilities failure")
	}
	if n := len(d.gotPublishes()); n != 0 {
		t.Fatalf("%d publishes", n)
	}
}

func TestKubeletDeletePod(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	pod := k.NewPod("ns", "p")
	for _, name := range []string{"a", "b"} {
		if err := k.Publish(ctx, pod, InlineVolume{Name: name, Secrets: map[string]string{"s": "v"}, Attributes: map[string]string{"k": "v"}}); err != nil {
			t.Fatal(err)
		}
	}
	k.ResetCalls()
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	got := d.gotUnpublishes()
	slices.SortFunc(got, func(a, b *csi.NodeUnpublishVolumeRequest) int { return strings.Compare(a.TargetPath, b.TargetPath) })
	for i, name := range []string{"a", "b"} {
		want := &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, name), TargetPath: k.TargetPath(pod, name)}
		if !proto.Equal(got[i], want) {
			t.Fatalf("unpublish = %v, want %v", got[i], want)
		}
	}
	if calls := k.Calls(); len(calls) != 2 || !strings.HasPrefix(calls[0], "NodeUnpublishVolume csi-") {
		t.Fatalf("calls = %q", calls)
	}
	if kpathExists(k.PodDir(pod)) {
		t.Fatal("pod dir left")
	}
	if k.State(pod, "a") != StateNone {
		t.Fatal("volume still tracked")
	}
}

func TestKubeletUnpublishFailuresKeepVolume(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "v")

	d.set(func(d *kfakeDriver) { d.unpublishErr = codes.Internal })
	err := k.DeletePod(ctx, pod)
	if status.Code(err) != codes.Internal {
		t.Fatalf("err = %v", err)
	}
	if k.State(pod, "v") != StateMounted || !kpathExists(target) {
		t.Fatal("volume forgotten after a failed unpublish")
	}

	// The driver "forgets" to remove the target and leaves data in it: the
	// kubelet's removeMountDir fails.
	d.set(func(d *kfakeDriver) { d.unpublishErr, d.keepTarget = codes.OK, true })
	if err := os.WriteFile(filepath.Join(target, "leftover"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := k.Unpublish(ctx, pod, "v"); err == nil {
		t.Fatal("Unpublish of a non-empty, unmounted target succeeded")
	}
	if k.State(pod, "v") != StateMounted {
		t.Fatal("volume forgotten after removeMountDir failed")
	}
	if err := os.Remove(filepath.Join(target, "leftover")); err != nil {
		t.Fatal(err)
	}
	if err := k.Unpublish(ctx, pod, "v"); err != nil {
		t.Fatal(err)
	}
	if kpathExists(filepath.Dir(target)) || k.State(pod, "v") != StateNone {
		t.Fatal("volume dir left after unpublish")
	}
	if n := len(d.gotUnpublishes()); n != 3 {
		t.Fatalf("%d unpublishes, want 3", n)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

func TestKubeletRestartDeletedPod(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	gone := k.NewPod("ns", "gone")
	kept := k.NewPod("ns", "kept")
	for _, p := range []*Pod{gone, kept} {
		if err := k.Publish(ctx, p, InlineVolume{Name: "v", Attributes: map[string]string{"a": "b"}}); err != nil {
			t.Fatal(err)
		}
	}
	k.DeletePodOffline(gone)
	k.ResetCalls()
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	unpubs := d.gotUnpublishes()
	want := &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(gone.UID, "v"), TargetPath: k.TargetPath(gone, "v")}
	if len(unpubs) != 1 || !proto.Equal(unpubs[0], want) {
		t.Fatalf("unpublishes = %v", unpubs)
	}
	pubs := d.gotPublishes()
	if len(pubs) != 3 || !proto.Equal(pubs[1], pubs[2]) || pubs[2].VolumeId != api.VolumeHandle(kept.UID, "v") {
		t.Fatalf("publishes = %v", pubs)
	}
	if k.CapabilityCalls() != 2 {
		t.Fatalf("%d capability calls", k.CapabilityCalls())
	}
	if kpathExists(k.PodDir(gone)) || !kpathExists(k.TargetPath(kept, "v")) {
		t.Fatal("unexpected directories after restart")
	}
	if k.State(gone, "v") != StateNone || k.State(kept, "v") != StateMounted {
		t.Fatal("unexpected state after restart")
	}
}

func TestKubeletRestartAfterFailedDelete(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{Retry: &Backoff{Attempts: 1}})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	d.set(func(d *kfakeDriver) { d.unpublishErr = codes.Unavailable })
	if err := k.DeletePod(ctx, pod); err == nil {
		t.Fatal("DeletePod succeeded")
	}
	d.set(func(d *kfakeDriver) { d.unpublishErr = codes.OK })
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(d.gotUnpublishes()); n != 2 {
		t.Fatalf("%d unpublishes", n)
	}
	if n := len(d.gotPublishes()); n != 1 {
		t.Fatalf("deleted pod republished (%d publishes)", n)
	}
	if kpathExists(k.PodDir(pod)) {
		t.Fatal("pod dir left")
	}
}

// A new Kubelet on an existing root is a kubelet that crashed and lost every
// pod: all volumes of this driver on disk get unpublished; other drivers'
// volumes are left alone.
func TestKubeletRestartFreshProcess(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	other := NewKubelet(KubeletOptions{Root: k.Root(), Endpoint: "/nonexistent/socket", DriverName: "other.example.com"})
	otherDir := filepath.Dir(other.TargetPath(pod, "w"))
	if err := os.MkdirAll(otherDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := other.writeVolData(otherDir, "w", api.VolumeHandle(pod.UID, "w")); err != nil {
		t.Fatal(err)
	}

	k2 := NewKubelet(KubeletOptions{Root: k.Root(), Endpoint: k.endpoint, DriverName: kfakeDriverName})
	if err := k2.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := k2.Calls(); !slices.Equal(got, []string{"NodeUnpublishVolume " + api.VolumeHandle(pod.UID, "v")}) {
		t.Fatalf("calls = %q", got)
	}
	if n := len(d.gotUnpublishes()); n != 1 {
		t.Fatalf("%d unpublishes", n)
	}
	if kpathExists(k.TargetPath(pod, "v")) || !kpathExists(otherDir) {
		t.Fatal("unexpected directories")
	}
}

func TestKubeletRepublish(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	pod := k.NewPod("ns", "p")
	if err := k.Republish(ctx, pod, "v"); err == nil {
		t.Fatal("Republish of an unpublished volume succeeded")
	}
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v", Tokens: `{"":{"token":"x"}}`}); err != nil {
		t.Fatal(err)
	}
	if err := k.Republish(ctx, pod, "v"); err != nil {
		t.Fatal(err)
	}
	pubs := d.gotPublishes()
	if len(pubs) != 2 || !proto.Equal(pubs[0], pubs[1]) {
		t.Fatalf("republish differs: %v", pubs)
	}
	if k.CapabilityCalls() != 4 {
		t.Fatalf("%d capability calls", k.CapabilityCalls())
	}
	// A final error on republish leaves a mounted volume mounted.
	d.set(func(d *kfakeDriver) { d.publishErr = codes.Internal })
	if err := k.Republish(ctx, pod, "v"); status.Code(err) != codes.Internal {
		t.Fatal(err)
	}
	if k.State(pod, "v") != StateMounted {
		t.Fatal("republish failure unmounted the volume")
	}
}

func TestKubeletOrphanPod(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.TargetPath(pod, "v"), "data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	k.ResetCalls()
	if err := k.OrphanPod(pod); err != nil {
		t.Fatal(err)
	}
	if kpathExists(k.PodDir(pod)) {
		t.Fatal("pod dir left")
	}
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if len(k.Calls()) != 0 || len(d.gotUnpublishes()) != 0 {
		t.Fatalf("RPCs for an orphaned pod: %q", k.Calls())
	}
}

// With a real mount at the target (root on Linux only), removeMountDir leaves
// it alone, DeletePod reports the leftover and OrphanPod keeps the mount.
func TestKubeletRealMountPoint(t *testing.T) {
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("needs root on Linux")
	}
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "v")
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", target).CombinedOutput(); err != nil {
		t.Skipf("cannot mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", target).Run() })
	if m, err := isMountPoint(target); err != nil || !m {
		t.Fatalf("isMountPoint = %v, %v", m, err)
	}
	if m, err := isMountPoint(filepath.Dir(target)); err != nil || m {
		t.Fatalf("isMountPoint(parent) = %v, %v", m, err)
	}
	d.set(func(d *kfakeDriver) { d.keepTarget = true }) // a buggy driver: no unmount
	err := k.DeletePod(ctx, pod)
	if err == nil || !strings.Contains(err.Error(), "still present") {
		t.Fatalf("DeletePod = %v", err)
	}
	if !kpathExists(filepath.Join(filepath.Dir(target), "vol_data.json")) {
		t.Fatal("removeMountDir touched a mounted volume")
	}
	if err := k.OrphanPod(pod); err != nil {
		t.Fatal(err)
	}
	if m, _ := isMountPoint(target); !m {
		t.Fatal("OrphanPod removed a mount")
	}
	if kpathExists(filepath.Join(filepath.Dir(target), "vol_data.json")) || kpathExists(filepath.Join(k.PodDir(pod), "plugins")) {
		t.Fatal("OrphanPod left unmounted parts")
	}
}

func TestKubeletEndpointForms(t *testing.T) {
	ctx := context.Background()
	_, sock := startKfake(t)
	for _, ep := range []string{sock, "unix://" + sock} {
		k := NewKubelet(KubeletOptions{Root: t.TempDir(), Endpoint: ep, DriverName: kfakeDriverName})
		pod := k.NewPod("ns", "p")
		if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
	}
	// Driver down: Unavailable, uncertain, volume dir kept.
	k := NewKubelet(KubeletOptions{Root: t.TempDir(), Endpoint: filepath.Join(t.TempDir(), "none.sock"), DriverName: kfakeDriverName})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v", err)
	}
	if k.State(pod, "v") != StateNone || !kpathExists(filepath.Dir(k.TargetPath(pod, "v"))) {
		t.Fatal("unexpected state with the driver down")
	}
}

func TestKubeletTimeout(t *testing.T) {
	// A listener that never answers: the operation ends with DeadlineExceeded
	// (non-final) after the configured timeout.
	dir, err := os.MkdirTemp("", "dt")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	lis, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	k := NewKubelet(KubeletOptions{Root: t.TempDir(), Endpoint: lis.Addr().String(), Timeout: 200 * time.Millisecond})
	start := time.Now()
	err = k.Publish(context.Background(), k.NewPod("ns", "p"), InlineVolume{Name: "v"})
	if IsFinal(err) || err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("err = %v after %v", err, time.Since(start))
	}
}

func TestKubeletConcurrent(t *testing.T) {
	ctx := context.Background()
	k, d := newTestKubelet(t, KubeletOptions{})
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pod := k.NewPod("ns", fmt.Sprintf("pod-%d", i))
			if err := k.Publish(ctx, pod, InlineVolume{Name: "v", Attributes: map[string]string{"i": fmt.Sprint(i)}}); err != nil {
				errs <- fmt.Errorf("publish %d: %w", i, err)
				return
			}
			if err := k.Republish(ctx, pod, "v"); err != nil {
				errs <- fmt.Errorf("republish %d: %w", i, err)
				return
			}
			if err := k.DeletePod(ctx, pod); err != nil {
				errs <- fmt.Errorf("delete %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := k.CapabilityCalls(); got != 4*n {
		t.Fatalf("%d capability calls, want %d", got, 4*n)
	}
	if got := len(d.gotPublishes()); got != 2*n {
		t.Fatalf("%d publishes", got)
	}
	if got := len(d.gotUnpublishes()); got != n {
		t.Fatalf("%d unpublishes", got)
	}
	entries, err := os.ReadDir(filepath.Join(k.Root(), "pods"))
	if err != nil || len(entries) != 0 {
		t.Fatalf("pods left: %d %v", len(entries), err)
	}
}

func TestKubeletIsFinal(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("plain"), false},
		{status.Error(codes.Canceled, ""), false},
		{status.Error(codes.DeadlineExceeded, ""), false},
		{status.Error(codes.Unavailable, ""), false},
		{status.Error(codes.ResourceExhausted, ""), false},
		{status.Error(codes.Aborted, ""), false},
		{status.Error(codes.Internal, ""), true},
		{status.Error(codes.InvalidArgument, ""), true},
		{status.Error(codes.NotFound, ""), true},
		{status.Error(codes.Unknown, ""), true},
		{fmt.Errorf("wrapped: %w", status.Error(codes.Internal, "")), true},
	} {
		if got := IsFinal(tc.err); got != tc.want {
			t.Errorf("IsFinal(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// DeletePod retries an unpublish the driver answers Aborted or Unavailable
// on the kubelet's schedule (here scaled) until it succeeds, as the kubelet
// does while a refresh holds the volume or the driver restarts; a final code
// is the answer at once.
func TestDeletePodRetriesInProgress(t *testing.T) {
	ctx := t.Context()
	fast := KubeletBackoff(1.0 / 50)
	k, d := newTestKubelet(t, KubeletOptions{Retry: &fast})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(ctx, pod, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	d.set(func(d *kfakeDriver) { d.unpublishErrs = []codes.Code{codes.Aborted, codes.Unavailable, codes.Aborted} })
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatalf("DeletePod: %v, want the retries to succeed", err)
	}
	if n := len(d.gotUnpublishes()); n != 4 {
		t.Errorf("%d unpublishes, want 3 refused and 1 that succeeded", n)
	}
	if kpathExists(k.PodDir(pod)) {
		t.Error("pod dir left")
	}

	final := k.NewPod("ns", "final")
	if err := k.Publish(ctx, final, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	before := len(d.gotUnpublishes())
	d.set(func(d *kfakeDriver) { d.unpublishErrs = []codes.Code{codes.Aborted, codes.InvalidArgument} })
	if err := k.DeletePod(ctx, final); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("DeletePod: %v, want the final InvalidArgument after one retry", err)
	}
	if n := len(d.gotUnpublishes()) - before; n != 2 {
		t.Errorf("%d unpublishes, want 2 (Aborted, then the final answer)", n)
	}
	if k.State(final, "v") != StateMounted {
		t.Error("volume forgotten after a final unpublish failure")
	}

	// One attempt: the first answer is the result.
	k.SetRetry(Backoff{Attempts: 1})
	before = len(d.gotUnpublishes())
	d.set(func(d *kfakeDriver) { d.unpublishErrs = []codes.Code{codes.Aborted} })
	if err := k.Unpublish(ctx, final, "v"); status.Code(err) != codes.Aborted {
		t.Fatalf("Unpublish with Attempts 1: %v, want Aborted", err)
	}
	if n := len(d.gotUnpublishes()) - before; n != 1 {
		t.Errorf("%d unpublishes with Attempts 1, want 1", n)
	}
}

// The retries of one teardown stay within KubeletOptions.Timeout: a driver
// that answers Aborted forever gets DeletePod's Aborted back, not a hang.
func TestDeletePodRetriesWithinTimeout(t *testing.T) {
	fast := KubeletBackoff(1.0 / 50)
	k, d := newTestKubelet(t, KubeletOptions{Retry: &fast, Timeout: 2 * time.Second})
	pod := k.NewPod("ns", "p")
	if err := k.Publish(t.Context(), pod, InlineVolume{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	d.set(func(d *kfakeDriver) { d.unpublishErr = codes.Aborted })
	// The last answer: Aborted, or the deadline when Timeout cut the last
	// attempt short.
	if err := k.DeletePod(t.Context(), pod); status.Code(err) != codes.Aborted && status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("DeletePod: %v, want Aborted (or DeadlineExceeded) once Timeout passed", err)
	}
	if n := len(d.gotUnpublishes()); n < 2 {
		t.Errorf("%d unpublishes, want retries within the timeout", n)
	}
}

// DeletePod unpublishes a pod's volumes in parallel, as the kubelet's
// operation executor does: volume a's unpublish answers only once volume b's
// has arrived.
func TestDeletePodUnpublishesInParallel(t *testing.T) {
	k, d := newTestKubelet(t, KubeletOptions{Retry: &Backoff{Attempts: 1}})
	ctx := t.Context()
	pod := k.NewPod("ns", "p")
	for _, name := range []string{"a", "b"} {
		if err := k.Publish(ctx, pod, InlineVolume{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	bArrived := make(chan struct{})
	var waited atomic.Bool
	d.set(func(d *kfakeDriver) {
		d.onUnpublish = func(req *csi.NodeUnpublishVolumeRequest) {
			switch filepath.Base(filepath.Dir(req.GetTargetPath())) {
			case "b":
				close(bArrived)
			case "a":
				select {
				case <-bArrived:
					waited.Store(true)
				case <-time.After(10 * time.Second):
				}
			}
		}
	})
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if !waited.Load() {
		t.Fatal("volume a's unpublish answered before volume b's was sent: DeletePod unpublished one after another")
	}
}
