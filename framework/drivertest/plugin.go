package drivertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
)

// EndpointEnv is the environment variable through which StartPlugin tells
// the plugin process its socket ("unix:///…/plugin.sock"). "{endpoint}" in
// PluginOptions.Args is replaced by the same value.
const EndpointEnv = "EPHEMERA_PLUGIN_ENDPOINT"

// PluginOptions describe a plugin process for a test.
type PluginOptions struct {
	// Command and Args start the plugin; "{endpoint}" in an argument is
	// replaced by its endpoint. To run a plugin from the test binary itself,
	// use os.Args[0] and an environment variable its TestMain recognises.
	Command string
	Args    []string
	// Env is added to the test's environment.
	Env []string
	// Endpoint is the socket; default a new one in a short temporary
	// directory (unix socket paths are limited to 107 bytes).
	Endpoint string
	// ReadyTimeout bounds the wait for the plugin's first handshake. Default 30s.
	ReadyTimeout time.Duration
}

// PluginProcess is a plugin running as its own process for one test. It is
// stopped (SIGTERM, then SIGKILL after 10 s) when the test ends.
type PluginProcess struct {
	// Endpoint is the plugin's socket, for plugin.Options.Endpoint.
	Endpoint string

	t    testing.TB
	opts PluginOptions
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartPlugin starts a plugin process and waits until it answers a
// handshake on its socket. Its output goes to t.Log.
func StartPlugin(t testing.TB, opts PluginOptions) *PluginProcess {
	t.Helper()
	if opts.Endpoint == "" {
		dir, err := os.MkdirTemp("", "ephemera-plugin")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		opts.Endpoint = "unix://" + filepath.Join(dir, "plugin.sock")
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	p := &PluginProcess{Endpoint: opts.Endpoint, t: t, opts: opts}
	t.Cleanup(p.Stop)
	p.Start()
	return p
}

// Start starts the plugin again after Kill or Stop (a restart), and waits
// until it answers a handshake.
func (p *PluginProcess) Start() {
	p.t.Helper()
	args := make([]string, len(p.opts.Args))
	for i, a := range p.opts.Args {
		args[i] = strings.ReplaceAll(a, "{endpoint}", p.Endpoint)
	}
	cmd := exec.Command(p.opts.Command, args...)
	cmd.Env = append(append(os.Environ(), p.opts.Env...), EndpointEnv+"="+p.Endpoint)
	out, err := cmd.StdoutPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("starting plugin %s: %v", p.opts.Command, err)
	}
	done := make(chan struct{})
	go func() {
		s := bufio.NewScanner(out)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			p.logf("plugin: %s", s.Text())
		}
		_ = cmd.Wait()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	if err := p.waitReady(done); err != nil {
		p.Kill()
		p.t.Fatalf("plugin %s: %v", p.opts.Command, err)
	}
}

// logf logs to the test while it runs (a plugin may print after it ended).
func (p *PluginProcess) logf(format string, args ...any) {
	defer func() { _ = recover() }() // t.Log after the test completed panics
	p.t.Logf(format, args...)
}

// waitReady waits for a handshake answer, or the process's end.
func (p *PluginProcess) waitReady(done chan struct{}) error {
	path := strings.TrimPrefix(p.Endpoint, "unix://")
	conn, err := unixsock.DialGRPC(path, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := pb.NewPluginClient(conn)
	deadline := time.Now().Add(p.opts.ReadyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := client.Handshake(ctx, &pb.HandshakeRequest{ProtocolVersions: []string{"v1alpha1"}})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return errors.New("exited before it served its socket")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no handshake on %s within %s: %v", p.Endpoint, p.opts.ReadyTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills the plugin with SIGKILL, as a crash or an OOM kill would, and
// waits for it to end. Its socket file stays, as after a real crash.
func (p *PluginProcess) Kill() { p.signal(syscall.SIGKILL, 0) }

// Stop stops the plugin with SIGTERM (SIGKILL after 10 s) and waits for it.
func (p *PluginProcess) Stop() { p.signal(syscall.SIGTERM, 10*time.Second) }

func (p *PluginProcess) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			_ = cmd.Process.Kill()
		}
	}
	<-done
}
