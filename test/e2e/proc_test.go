//go:build e2e && linux

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a host process started by the harness. Its stdout and stderr go to one log
// file. Every PID (with its start time, to survive PID reuse) is appended to the run
// root's "pids" file so that a later run can kill what a crashed run left behind.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
	mu      sync.Mutex
	err     error
}

// startProc starts bin with args, logging to <logDir>/<name>.log (appending, so a
// restarted process keeps one log).
func (c *cluster) startProc(name, bin string, args []string, env []string) (*proc, error) {
	logPath := filepath.Join(c.logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "==== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Env = append(os.Environ(), env...)
	// Every process gets its own empty working directory below the run root. This is
	// not cosmetic: with the fake CRI (which reports no container log path) the
	// kubelet's container-log cleanup globs "<empty>*" and deletes the files of its
	// working directory; it once ate the test sources when run from test/e2e.
	cmd.Dir = filepath.Join(c.root, "cwd", name)
	if err := os.MkdirAll(cmd.Dir, 0o755); err != nil {
		f.Close()
		return nil, err
	}
	// A new process group: a Ctrl-C on the test does not hit the children first, and
	// teardown stays in control of the order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, logFile: f, done: make(chan struct{})}
	c.recordPID(cmd.Process.Pid)
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		f.Close()
		close(p.done)
	}()
	c.logf("started %s pid %d (log %s)", name, cmd.Process.Pid, logPath)
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs. It is a no-op for an exited
// process.
func (p *proc) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.kill()
}

// kill sends SIGKILL and waits for the process to be reaped.
func (p *proc) kill() {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// procStartTime returns field 22 of /proc/PID/stat (start time in clock ticks).
func procStartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", errors.New("bad stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", errors.New("short stat")
	}
	return f[19], nil
}

func (c *cluster) recordPID(pid int) {
	st, err := procStartTime(pid)
	if err != nil {
		return
	}
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	f, err := os.OpenFile(filepath.Join(c.root, "pids"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%d %s\n", pid, st)
	f.Close()
}

// killRecorded SIGKILLs every process listed in dir/pids that still runs with the
// recorded start time.
func killRecorded(dir string) {
	f, err := os.Open(filepath.Join(dir, "pids"))
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 2 {
			continue
		}
		pid, err := strconv.Atoi(fs[0])
		if err != nil || pid <= 1 {
			continue
		}
		if st, err := procStartTime(pid); err == nil && st == fs[1] {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 5*time.Second)
		}
	}
}

// killByCmdline SIGKILLs the processes whose command line mentions needle (the run
// root): containerd shims and container processes started on the harness's behalf
// by the container runtime, which are not our children.
func killByCmdline(needle string) {
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid <= 1 {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), needle) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 5*time.Second)
		}
	}
}

func waitGone(pid int, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		// Zombies of other parents still answer kill 0; check the state.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			s := string(b)
			if i := strings.LastIndexByte(s, ')'); i > 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z") {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
