//go:build linux

package hostile

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// StartOptions say how [Start] runs a plugin process.
type StartOptions struct {
	// Log is the file the process's output is appended to (every restart's
	// too). Required.
	Log string
	// RestartDelay, when positive, starts the process again this long after
	// it ended on its own (a Crash plugin; a crash-looping container).
	RestartDelay time.Duration
	// ReadyTimeout bounds the wait for its first handshake. Default 20s.
	ReadyTimeout time.Duration
}

// Process is a hostile plugin running as its own process: this test binary
// again, whose TestMain calls [Main]. It is killed when the test ends (and by
// the kernel when the test process dies first).
type Process struct {
	// Endpoint is its socket.
	Endpoint string

	opts  Options
	start StartOptions

	mu      sync.Mutex
	cmd     *exec.Cmd
	stopped bool
	starts  int
	quit    chan struct{} // closed by Stop
	done    chan struct{} // closed when the supervisor ended
}

// Start starts the plugin of opts as a process, waits until it answers a
// handshake, and supervises it: restarted after StartOptions.RestartDelay
// when it ends on its own, killed at the test's end. It must be called from
// the test's goroutine.
func Start(t testing.TB, opts Options, so StartOptions) *Process {
	t.Helper()
	opts.setDefaults()
	if so.ReadyTimeout <= 0 {
		so.ReadyTimeout = 20 * time.Second
	}
	p := &Process{Endpoint: opts.Endpoint, opts: opts, start: so, quit: make(chan struct{}), done: make(chan struct{})}
	cmd, err := p.spawn()
	if err != nil {
		t.Fatalf("starting hostile plugin %s: %v", opts.Mode, err)
	}
	p.cmd, p.starts = cmd, 1
	go p.supervise(cmd)
	t.Cleanup(p.Stop)
	if err := p.waitReady(so.ReadyTimeout); err != nil {
		log, _ := os.ReadFile(so.Log)
		t.Fatalf("hostile plugin %s: %v\n%s", opts.Mode, err, log)
	}
	return p
}

// spawn starts one process.
func (p *Process) spawn() (*exec.Cmd, error) {
	log, err := os.OpenFile(p.start.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), p.opts.Environ()...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// supervise waits for each process, and starts the next one after
// RestartDelay unless stopped.
func (p *Process) supervise(cmd *exec.Cmd) {
	defer close(p.done)
	for {
		if cmd != nil {
			_ = cmd.Wait()
		}
		if p.start.RestartDelay <= 0 {
			return
		}
		select {
		case <-p.quit:
			return
		case <-time.After(p.start.RestartDelay):
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return
		}
		next, err := p.spawn()
		if err != nil {
			p.mu.Unlock()
			p.note("restarting: %v", err)
			cmd = nil
			continue
		}
		p.cmd, cmd = next, next
		p.starts++
		p.mu.Unlock()
	}
}

// note appends a line to the log.
func (p *Process) note(format string, args ...any) {
	if f, err := os.OpenFile(p.start.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "hostile supervisor: "+format+"\n", args...)
		f.Close()
	}
}

// waitReady waits for a handshake answer on the socket, on a new connection
// each time (gRPC waits a second before it dials a socket again).
func (p *Process) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := handshake(p.Endpoint)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited before it served %s", p.Endpoint)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no handshake on %s within %s: %v", p.Endpoint, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// handshake makes one handshake with the plugin at endpoint.
func handshake(endpoint string) error {
	if _, err := os.Stat(strings.TrimPrefix(endpoint, "unix://")); err != nil {
		return err
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = pb.NewPluginClient(conn).Handshake(ctx, &pb.HandshakeRequest{ProtocolVersions: []string{plugin.ProtocolVersion}})
	return err
}

// Starts returns how many processes were started (1 + restarts).
func (p *Process) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Stop kills the process (SIGKILL: a hung plugin would not stop on SIGTERM),
// ends the supervision and waits for both. It may be called more than once.
func (p *Process) Stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		<-p.done
		return
	}
	p.stopped = true
	cmd := p.cmd
	close(p.quit)
	p.mu.Unlock()
	_ = cmd.Process.Kill()
	<-p.done
}
