//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// tokens is the JSON the kubelet puts under csi.storage.k8s.io/serviceAccount.tokens.
func tokens(audience, token string) string {
	return `{"` + audience + `":{"token":"` + token + `","expirationTimestamp":"2030-01-01T00:00:00Z"}}`
}

// start runs the driver in-process, allowing namespaces "team-a" and "team-b",
// with its log at verbosity 10 captured in the returned buffer.
func start(t *testing.T) (*drivertest.Harness, *drivertest.SyncBuffer) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounts tmpfs: run as root")
	}
	var log drivertest.SyncBuffer
	opts, err := Options()
	if err != nil {
		t.Fatal(err)
	}
	opts.Volumes.Authorizer = allowNamespaces("team-a, team-b")
	opts.Observability.Logger = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&log), textlogger.Verbosity(10)))
	return drivertest.Start(t, opts), &log
}

func TestTokenFile(t *testing.T) {
	h, log := start(t)
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("team-a", "app")
	vol := drivertest.InlineVolume{Name: "vault", ReadOnly: true,
		Attributes: map[string]string{"audience": "vault"}, Tokens: tokens("vault", "tok-1")}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatalf("publish: %v", err)
	}
	target := k.TargetPath(pod, "vault")
	t.Cleanup(func() { syscall.Unmount(target, syscall.MNT_DETACH) }) // only if the test failed midway
	file := filepath.Join(target, "token")
	expect(t, file, "tok-1")
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("readOnly volume is writable: %v", err)
	}
	id := mountID(t, target)

	// requiresRepublish with rotated tokens, in volume_context and (Kubernetes
	// 1.35 serviceAccountTokenInSecrets) in secrets: new content, same mount.
	for _, rot := range []struct {
		token     string
		inSecrets bool
	}{{"tok-2", false}, {"tok-3", true}} {
		vol.Tokens, vol.TokensInSecrets = tokens("vault", rot.token), rot.inSecrets
		if err := k.Publish(ctx, pod, vol); err != nil {
			t.Fatalf("republish with %s: %v", rot.token, err)
		}
		expect(t, file, rot.token)
		if got := mountID(t, target); got != id || countMounts(t, target) != 1 {
			t.Fatalf("republish changed the mount: id %d -> %d, %d mounts", id, got, countMounts(t, target))
		}
	}

	// A republish without a token for the audience (tokenRequests edited, say)
	// keeps the last good token and says why with a retryable code (the
	// kubelet records it on the pod and retries); the next good one replaces
	// it.
	vol.Tokens = tokens("other", "tok-other")
	if err := k.Publish(ctx, pod, vol); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "spec.tokenRequests") {
		t.Fatalf("republish without the audience's token: %v, want Unavailable naming spec.tokenRequests", err)
	}
	expect(t, file, "tok-3")
	vol.Tokens = tokens("vault", "tok-4")
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	expect(t, file, "tok-4")
	if countMounts(t, target) != 1 {
		t.Fatal("more than one mount at the target")
	}

	// format json and fileName, in a second volume of the same pod.
	jvol := drivertest.InlineVolume{Name: "vault-json", ReadOnly: true,
		Attributes: map[string]string{"audience": "vault", "fileName": "vault.json", "format": "json"},
		Tokens:     tokens("vault", "tok-5"), TokensInSecrets: true}
	if err := k.Publish(ctx, pod, jvol); err != nil {
		t.Fatalf("publish json: %v", err)
	}
	jtarget := k.TargetPath(pod, "vault-json")
	t.Cleanup(func() { syscall.Unmount(jtarget, syscall.MNT_DETACH) })
	var got struct {
		Token               string `json:"token"`
		ExpirationTimestamp string `json:"expirationTimestamp"`
	}
	if b, err := os.ReadFile(filepath.Join(jtarget, "vault.json")); err != nil || json.Unmarshal(b, &got) != nil {
		t.Fatalf("vault.json: %q, %v", b, err)
	}
	if got.Token != "tok-5" || got.ExpirationTimestamp != "2030-01-01T00:00:00Z" {
		t.Fatalf("vault.json = %+v", got)
	}

	// A driver restart keeps the volume; the next republish brings a token.
	h.RestartDriver()
	vol.Tokens = tokens("vault", "tok-6")
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatalf("republish after a driver restart: %v", err)
	}
	expect(t, file, "tok-6")
	if got := mountID(t, target); got != id {
		t.Fatalf("driver restart changed the mount: id %d -> %d", id, got)
	}

	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	if n := len(mountsUnder(t, k.Root())); n != 0 {
		t.Errorf("%d mounts left under the kubelet root", n)
	}
	if _, err := os.Stat(k.PodDir(pod)); !os.IsNotExist(err) {
		t.Errorf("pod directory left behind: %v", err)
	}

	h.Stop() // flush: no refresh retry logs after this
	for _, tok := range []string{"tok-1", "tok-2", "tok-3", "tok-4", "tok-5", "tok-6", "tok-other"} {
		if strings.Contains(log.String(), tok) {
			t.Errorf("the driver logged token %s", tok)
		}
	}
	if !strings.Contains(log.String(), "spec.tokenRequests") {
		t.Error("the failed refresh was not logged")
	}
}

func TestTokenFileRefusals(t *testing.T) {
	h, _ := start(t)
	k, ctx := h.Kubelet, t.Context()
	for _, tc := range []struct {
		name, namespace string
		attrs           map[string]string
		tokens          string
		code            codes.Code
		msg             string
	}{
		{"no token for the audience", "team-a", map[string]string{"audience": "vault"}, tokens("other", "x"),
			codes.InvalidArgument, "CSIDriver tokenfile.csi.ephemera.dev must list audience \"vault\" in spec.tokenRequests"},
		{"no tokenRequests at all", "team-a", map[string]string{"audience": "vault"}, "",
			codes.InvalidArgument, "spec.tokenRequests"},
		{"namespace not allowed", "team-c", map[string]string{"audience": "vault"}, tokens("vault", "x"),
			codes.PermissionDenied, "--allowed-namespaces"},
		{"audience missing", "team-a", map[string]string{}, tokens("vault", "x"),
			codes.InvalidArgument, `"audience" is required`},
		{"bad format", "team-a", map[string]string{"audience": "vault", "format": "yaml"}, tokens("vault", "x"),
			codes.InvalidArgument, `"format"`},
		{"path in fileName", "team-a", map[string]string{"audience": "vault", "fileName": "../etc/passwd"}, tokens("vault", "x"),
			codes.InvalidArgument, `"fileName"`},
		{"typo", "team-a", map[string]string{"audiance": "vault"}, tokens("vault", "x"),
			codes.InvalidArgument, `"audiance"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := k.NewPod(tc.namespace, "p")
			err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: tc.attrs, Tokens: tc.tokens})
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("publish: %v, want %v mentioning %s", err, tc.code, tc.msg)
			}
			if _, err := os.Stat(k.TargetPath(pod, "v")); !os.IsNotExist(err) {
				t.Errorf("target left behind: %v", err)
			}
			if st := k.State(pod, "v"); st != drivertest.StateNone {
				t.Errorf("kubelet state %v, want none", st)
			}
		})
	}
	if n := len(mountsUnder(t, k.Root())); n != 0 {
		t.Errorf("%d mounts left under the kubelet root", n)
	}
}

func expect(t *testing.T, file, want string) {
	t.Helper()
	if got, err := os.ReadFile(file); err != nil || string(got) != want {
		t.Fatalf("%s = %q (%v), want %q", file, got, err, want)
	}
}

func mountsUnder(t *testing.T, dir string) []mount.MountInfo {
	t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	var out []mount.MountInfo
	for _, mi := range infos {
		if mi.MountPoint == dir || strings.HasPrefix(mi.MountPoint, dir+"/") {
			out = append(out, mi)
		}
	}
	return out
}

func countMounts(t *testing.T, target string) int {
	t.Helper()
	n := 0
	for _, mi := range mountsUnder(t, target) {
		if mi.MountPoint == target {
			n++
		}
	}
	return n
}

func mountID(t *testing.T, target string) int {
	t.Helper()
	for _, mi := range mountsUnder(t, target) {
		if mi.MountPoint == target {
			return mi.ID
		}
	}
	t.Fatalf("%s is not mounted", target)
	return 0
}
