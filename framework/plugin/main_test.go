package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// The test binary is also the plugin process of these tests: with
// modeEnv set, TestMain serves a plugin instead of running tests.
const (
	modeEnv = "EPHEMERA_TEST_PLUGIN" // "content" or "dir"
	// versionEnv is the plugin's version; its files carry it.
	versionEnv = "EPHEMERA_TEST_PLUGIN_VERSION"
	// hangEnv names a call ("Create", "Content") that blocks until the
	// process ends, after creating the file hangMarker beside the socket.
	hangEnv = "EPHEMERA_TEST_PLUGIN_HANG"
	// denyEnv names a namespace the plugin's Authorize refuses (with it the
	// plugin implements AUTHORIZE).
	denyEnv = "EPHEMERA_TEST_PLUGIN_DENY"
	// dirEnv is the directory the "dir" plugin shares with the driver.
	dirEnv = "EPHEMERA_TEST_PLUGIN_DIR"
)

const hangMarker = "hanging"

func TestMain(m *testing.M) {
	if mode := os.Getenv(modeEnv); mode != "" {
		if err := servePlugin(mode); err != nil {
			fmt.Fprintln(os.Stderr, "test plugin:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// servePlugin runs the test plugin until SIGTERM.
func servePlugin(mode string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	endpoint := os.Getenv(drivertest.EndpointEnv)
	version := os.Getenv(versionEnv)
	hang := func(call string) {
		if os.Getenv(hangEnv) == call {
			_ = os.WriteFile(filepath.Join(filepath.Dir(strings.TrimPrefix(endpoint, "unix://")), hangMarker), nil, 0o600)
			select {}
		}
	}
	opts := pluginserver.Options{
		Name:     "test-plugin",
		Version:  version,
		Endpoint: endpoint,
		Content: framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			hang("Content")
			return map[string]api.File{
				"pod":     {Data: []byte(v.Pod.Namespace + "/" + v.Pod.Name)},
				"version": {Data: []byte(version), Mode: 0o444},
			}, nil
		}),
	}
	if ns := os.Getenv(denyEnv); ns != "" {
		opts.Authorizer = framework.AuthorizerFunc(func(_ context.Context, v *api.Volume) error {
			if v.Pod.Namespace == ns {
				return fmt.Errorf("%w: namespace %s may not use test-plugin", api.ErrPermissionDenied, ns)
			}
			return nil
		})
	}
	switch mode {
	case "content":
	case "dir":
		opts.Dir = os.Getenv(dirEnv)
		b, err := dir.New(dir.Options{Root: opts.Dir})
		if err != nil {
			return err
		}
		opts.Backend = hangingDir{b, hang}
	default:
		return errors.New("unknown mode " + mode)
	}
	return pluginserver.Serve(ctx, opts)
}

// startPlugin starts the test binary as a plugin process.
func startPlugin(t *testing.T, mode string, env ...string) *drivertest.PluginProcess {
	t.Helper()
	return drivertest.StartPlugin(t, drivertest.PluginOptions{
		Command:      os.Args[0],
		Env:          append([]string{modeEnv + "=" + mode}, env...),
		ReadyTimeout: 20 * time.Second,
	})
}

// waitHanging waits until the plugin process p entered its hanging call.
func waitHanging(t *testing.T, p *drivertest.PluginProcess) {
	t.Helper()
	marker := filepath.Join(filepath.Dir(strings.TrimPrefix(p.Endpoint, "unix://")), hangMarker)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			_ = os.Remove(marker)
			return
		}
	}
	t.Fatal("the plugin never entered its hanging call")
}

// hangingDir is the dir backend whose Create may hang.
type hangingDir struct {
	*dir.Backend
	hang func(call string)
}

func (h hangingDir) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	h.hang("Create")
	return h.Backend.Create(ctx, v)
}
