package registration

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	testDriver   = "ephemera.csi.example.com"
	waitDeadline = 10 * time.Second
)

// shortDir returns a fresh directory with a short path: UNIX socket paths are
// limited to 107 bytes, and t.TempDir() paths can be longer.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func testOptions(t *testing.T) Options {
	t.Helper()
	d := shortDir(t)
	return Options{
		Logger:          ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(4))),
		DriverName:      testDriver,
		Endpoint:        filepath.Join(d, "csi.sock"),
		RegistrationDir: filepath.Join(d, "plugins_registry"),
	}
}

// runner is a Registrar running in a goroutine.
type runner struct {
	r      *Registrar
	cancel context.CancelFunc
	done   chan error
	waited bool
	err    error
}

// start runs a Registrar for opts in the background. It does not wait for
// the socket; use waitReady.
func start(t *testing.T, opts Options) *runner {
	t.Helper()
	r, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	rn := &runner{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rn.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if !rn.waited {
			select {
			case <-rn.done:
			case <-time.After(waitDeadline):
				t.Error("Run did not return after cancel")
			}
		}
	})
	return rn
}

// wait returns Run's result, failing the test if Run does not return in time.
func (rn *runner) wait(t *testing.T) error {
	t.Helper()
	if rn.waited {
		return rn.err
	}
	select {
	case rn.err = <-rn.done:
		rn.waited = true
		return rn.err
	case <-time.After(waitDeadline):
		t.Fatal("Run did not return")
		return nil
	}
}

// waitReady waits until the registration socket accepts connections, the way
// the Windows kubelet detects it.
func (rn *runner) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for {
		select {
		case err := <-rn.done:
			rn.waited, rn.err = true, err
			t.Fatalf("Run returned before serving: %v", err)
		default:
		}
		c, err := net.DialTimeout("unix", rn.r.SocketPath(), time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("registration socket never accepted connections: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fakeKubelet dials the registration socket as the kubelet does.
func fakeKubelet(t *testing.T, socket string) registerapi.RegistrationClient {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return registerapi.NewRegistrationClient(cc)
}

// staleSocket leaves a socket file at path that nobody listens on, as a
// killed process would.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func assertNoFile(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Lstat(%s) = %v, want not exist", path, err)
	}
}

func TestGetInfo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		versions []string
		want     []string
	}{
		{name: "default versions", want: []string{"1.0.0"}},
		{name: "explicit versions", versions: []string{"0.3.0", "1.0.0"}, want: []string{"0.3.0", "1.0.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t)
			opts.Versions = tc.versions
			rn := start(t, opts)
			rn.waitReady(t)

			ctx, cancel := context.WithTimeout(t.Context(), time.Second) // the kubelet's GetInfo timeout
			defer cancel()
			info, err := fakeKubelet(t, rn.r.SocketPath()).GetInfo(ctx, &registerapi.InfoRequest{})
			if err != nil {
				t.Fatalf("GetInfo: %v", err)
			}
			if got, want := info.GetType(), registerapi.CSIPlugin; got != want {
				t.Errorf("Type = %q, want %q", got, want)
			}
			if got, want := info.GetName(), testDriver; got != want {
				t.Errorf("Name = %q, want %q", got, want)
			}
			if got, want := info.GetEndpoint(), opts.Endpoint; got != want {
				t.Errorf("Endpoint = %q, want %q", got, want)
			}
			if got := info.GetSupportedVersions(); !slices.Equal(got, tc.want) {
				t.Errorf("SupportedVersions = %q, want %q", got, tc.want)
			}
			if rn.r.Registered() {
				t.Error("Registered() = true before NotifyRegistrationStatus")
			}
		})
	}
}

func TestNotifyRegistered(t *testing.T) {
	rn := start(t, testOptions(t))
	rn.waitReady(t)

	_, err := fakeKubelet(t, rn.r.SocketPath()).NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true})
	if err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	if !rn.r.Registered() {
		t.Error("Registered() = false after a successful registration")
	}
	if reg, lastErr := rn.r.Status(); !reg || lastErr != "" {
		t.Errorf("Status() = (%v, %q), want (true, \"\")", reg, lastErr)
	}

	rn.cancel()
	if err := rn.wait(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	if rn.r.Registered() {
		t.Error("Registered() = true after Run returned")
	}
}

func TestNotifyFailed(t *testing.T) {
	opts := testOptions(t)
	rn := start(t, opts)
	rn.waitReady(t)

	_, err := fakeKubelet(t, rn.r.SocketPath()).NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: false, Error: "boom"})
	if err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	runErr := rn.wait(t)
	if !errors.Is(runErr, ErrRegistrationFailed) {
		t.Fatalf("Run = %v, want an error wrapping ErrRegistrationFailed", runErr)
	}
	if !strings.Contains(runErr.Error(), "boom") {
		t.Errorf("Run = %q, want the kubelet's message %q in it", runErr, "boom")
	}
	if reg, lastErr := rn.r.Status(); reg || lastErr != "boom" {
		t.Errorf("Status() = (%v, %q), want (false, \"boom\")", reg, lastErr)
	}
	assertNoFile(t, rn.r.SocketPath())

	// A restarted Run registers again, and success clears the last error.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- rn.r.Run(ctx) }()
	rn2 := &runner{r: rn.r, cancel: cancel, done: done}
	t.Cleanup(func() { cancel(); _ = rn2.wait(t) })
	rn2.waitReady(t)
	if _, err := fakeKubelet(t, rn.r.SocketPath()).NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	if reg, lastErr := rn.r.Status(); !reg || lastErr != "" {
		t.Errorf("Status() after re-registration = (%v, %q), want (true, \"\")", reg, lastErr)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	opts := testOptions(t)
	if err := os.MkdirAll(opts.RegistrationDir, 0o750); err != nil {
		t.Fatal(err)
	}
	path := socketPath(opts.RegistrationDir, opts.DriverName)
	staleSocket(t, path)

	rn := start(t, opts)
	// Nobody listens on the stale socket, so a successful dial and GetInfo
	// prove that it was replaced. (Comparing inodes does not: the freed inode
	// of the stale socket is often reused.)
	rn.waitReady(t)
	if _, err := fakeKubelet(t, path).GetInfo(t.Context(), &registerapi.InfoRequest{}); err != nil {
		t.Errorf("GetInfo on the new socket: %v", err)
	}
}

// A second Registrar for the same driver (the driver running twice on the
// node, or node-driver-registrar deployed for it as well) must not take over
// the live socket: its Run fails, and the first keeps serving the kubelet.
func TestLiveSocketNotTakenOver(t *testing.T) {
	opts := testOptions(t)
	first := start(t, opts)
	first.waitReady(t)
	path := first.r.SocketPath()
	before, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}

	second := start(t, opts)
	err = second.wait(t)
	if err == nil || !strings.Contains(err.Error(), "another process serves") || !strings.Contains(err.Error(), path) {
		t.Fatalf("second Run = %v, want an error naming %s and saying another process serves it", err, path)
	}
	if errors.Is(err, ErrRegistrationFailed) {
		t.Errorf("second Run = %v, must not wrap ErrRegistrationFailed", err)
	}
	after, err := os.Lstat(path)
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the first Registrar's socket was removed or replaced: %v", err)
	}
	if _, err := fakeKubelet(t, path).GetInfo(t.Context(), &registerapi.InfoRequest{}); err != nil {
		t.Errorf("GetInfo on the first Registrar's socket: %v", err)
	}
}

func TestNonSocketRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		create func(path string) error
	}{
		{name: "regular file", create: func(p string) error { return os.WriteFile(p, []byte("keep me"), 0o600) }},
		{name: "directory", create: func(p string) error { return os.Mkdir(p, 0o700) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := testOptions(t)
			if err := os.MkdirAll(opts.RegistrationDir, 0o750); err != nil {
				t.Fatal(err)
			}
			path := socketPath(opts.RegistrationDir, opts.DriverName)
			if err := tc.create(path); err != nil {
				t.Fatal(err)
			}
			before, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}

			rn := start(t, opts)
			err = rn.wait(t)
			if err == nil || !strings.Contains(err.Error(), "not a socket") {
				t.Fatalf("Run = %v, want a \"not a socket\" error", err)
			}
			if errors.Is(err, ErrRegistrationFailed) {
				t.Errorf("Run = %v, must not wrap ErrRegistrationFailed", err)
			}
			after, err := os.Lstat(path)
			if err != nil {
				t.Fatalf("the existing file was removed: %v", err)
			}
			if !os.SameFile(before, after) {
				t.Error("the existing file was replaced")
			}
		})
	}
}

func TestCancelRemovesSocket(t *testing.T) {
	rn := start(t, testOptions(t))
	rn.waitReady(t)

	rn.cancel()
	if err := rn.wait(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	assertNoFile(t, rn.r.SocketPath())
}

func TestCancelKeepsReplacedSocket(t *testing.T) {
	rn := start(t, testOptions(t))
	rn.waitReady(t)

	// A newer instance removes our socket and creates its own.
	path := rn.r.SocketPath()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	newer, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}

	rn.cancel()
	if err := rn.wait(t); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	cur, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("the newer instance's socket was removed: %v", err)
	}
	if !os.SameFile(newer, cur) {
		t.Error("the newer instance's socket was replaced")
	}
}

func TestCanceledBeforeRun(t *testing.T) {
	opts := testOptions(t)
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run with a canceled context = %v, want nil", err)
	}
	assertNoFile(t, r.SocketPath())
}

func TestSocketAndDirMode(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("file modes are not used on Windows")
	}
	opts := testOptions(t)
	rn := start(t, opts)
	rn.waitReady(t)

	fi, err := os.Lstat(rn.r.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		t.Errorf("socket type = %v, want socket", fi.Mode().Type())
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("socket mode = %#o, want 0600", got)
	}
	di, err := os.Stat(opts.RegistrationDir)
	if err != nil {
		t.Fatalf("RegistrationDir was not created: %v", err)
	}
	if got := di.Mode().Perm(); !di.IsDir() || got&^0o750 != 0 {
		t.Errorf("RegistrationDir mode = %v, want a directory with at most 0750", di.Mode())
	}
}

func TestRunConcurrentlyRefused(t *testing.T) {
	rn := start(t, testOptions(t))
	rn.waitReady(t)

	err := rn.r.Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second Run = %v, want an \"already running\" error", err)
	}
	// The first Run is unaffected.
	if _, err := fakeKubelet(t, rn.r.SocketPath()).GetInfo(t.Context(), &registerapi.InfoRequest{}); err != nil {
		t.Errorf("GetInfo: %v", err)
	}
}

func TestNew(t *testing.T) {
	base := filepath.Join(os.TempDir(), "kubelet")
	valid := func() Options {
		return Options{
			DriverName:      testDriver,
			Endpoint:        filepath.Join(base, "plugins", testDriver, "csi.sock"),
			RegistrationDir: filepath.Join(base, "plugins_registry"),
		}
	}
	for _, tc := range []struct {
		name    string
		modify  func(*Options)
		wantErr string // substring; "" means success
	}{
		{name: "valid", modify: func(*Options) {}},
		{name: "valid short name", modify: func(o *Options) { o.DriverName = "a" }},
		{name: "empty name", modify: func(o *Options) { o.DriverName = "" }, wantErr: "DriverName is required"},
		{name: "name with slash", modify: func(o *Options) { o.DriverName = "a/b" }, wantErr: "not a valid CSI driver name"},
		{name: "name with backslash", modify: func(o *Options) { o.DriverName = `a\b` }, wantErr: "not a valid CSI driver name"},
		{name: "name with path separator", modify: func(o *Options) { o.DriverName = "a" + string(filepath.Separator) + "b" }, wantErr: "not a valid CSI driver name"},
		{name: "dot-dot name", modify: func(o *Options) { o.DriverName = ".." }, wantErr: "not a valid CSI driver name"},
		{name: "leading dot (ignored by the kubelet)", modify: func(o *Options) { o.DriverName = ".hidden" }, wantErr: "not a valid CSI driver name"},
		{name: "name too long", modify: func(o *Options) { o.DriverName = strings.Repeat("a", 64) }, wantErr: "not a valid CSI driver name"},
		{name: "empty endpoint", modify: func(o *Options) { o.Endpoint = "" }, wantErr: "Endpoint is required"},
		{name: "relative endpoint", modify: func(o *Options) { o.Endpoint = "csi.sock" }, wantErr: "absolute host path"},
		{name: "endpoint with scheme", modify: func(o *Options) { o.Endpoint = "unix://" + o.Endpoint }, wantErr: "absolute host path"},
		{name: "empty dir", modify: func(o *Options) { o.RegistrationDir = "" }, wantErr: "RegistrationDir is required"},
		{name: "relative dir", modify: func(o *Options) { o.RegistrationDir = "plugins_registry" }, wantErr: "must be an absolute path"},
		{name: "empty version", modify: func(o *Options) { o.Versions = []string{"1.0.0", ""} }, wantErr: "Versions[1] is empty"},
		{name: "socket path too long", modify: func(o *Options) { o.RegistrationDir = filepath.Join(base, strings.Repeat("d", 100)) }, wantErr: "UNIX socket limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := valid()
			tc.modify(&opts)
			r, err := New(opts)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if r == nil {
					t.Fatal("New returned a nil Registrar")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.wantErr)
			}
			if r != nil {
				t.Error("New returned a Registrar with an error")
			}
		})
	}
}

func TestNewDefaultsAndSocketPath(t *testing.T) {
	dir := filepath.Join(shortDir(t), "plugins_registry")
	versions := []string{"1.0.0"}
	r, err := New(Options{DriverName: testDriver, Endpoint: filepath.Join(os.TempDir(), "csi.sock"), RegistrationDir: dir, Versions: versions})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.SocketPath(), filepath.Join(dir, testDriver+"-reg.sock"); got != want {
		t.Errorf("SocketPath() = %q, want %q", got, want)
	}
	versions[0] = "changed"
	if got := r.opts.Versions; !slices.Equal(got, []string{"1.0.0"}) {
		t.Errorf("Versions = %q; New must copy the caller's slice", got)
	}
	if r.opts.Logger.GetSink() == nil {
		t.Error("Logger was not defaulted")
	}
	if reg, lastErr := r.Status(); reg || lastErr != "" {
		t.Errorf("Status() of a new Registrar = (%v, %q), want (false, \"\")", reg, lastErr)
	}

	r, err = New(Options{DriverName: testDriver, Endpoint: filepath.Join(os.TempDir(), "csi.sock"), RegistrationDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.opts.Versions; !slices.Equal(got, []string{"1.0.0"}) {
		t.Errorf("default Versions = %q, want [1.0.0]", got)
	}
	assertNoFile(t, dir) // New does no I/O
}
