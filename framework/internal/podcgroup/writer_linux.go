package podcgroup

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// writerEnv and writerArg0 mark a process as a writer: both must be
	// set (argv[0] and the environment) for the package's init to run the
	// writer instead of the program.
	writerEnv      = "EPHEMERA_PODCGROUP_WRITER"
	writerEnvValue = "1"
	writerArg0     = "ephemera-pod-writer"
	// leafPrefix starts the name of a v2 writer's leaf cgroup.
	leafPrefix = "ephemera-writer-"
	// selfExe is the running binary, whatever its name on disk (or none:
	// replaced or deleted since it started).
	selfExe = "/proc/self/exe"
	// outputLimit bounds what the parent keeps of a writer's stdout and
	// stderr.
	outputLimit = 4096
)

// Write writes files into dir from a short-lived process whose memory
// cgroup is the pod's, so that every page the files take (tmpfs pages are
// charged to the memory cgroup of the task that first allocates them) is
// charged to the pod, not to the driver: the driver's own binary, started
// again as a writer (the package's init runs it; see the package
// documentation). On v2 the writer is born in a leaf cgroup of its own
// below the pod's (clone3 CLONE_INTO_CGROUP), made for this write and
// removed after it; on v1 it is moved into the pod's memory cgroup before
// it is sent a byte of the files. Either way it allocates no page of the
// files before it is the pod's.
//
// dir is an open directory, opened for reading (not O_PATH: the writer
// fsyncs it); the writer gets a duplicate of the descriptor and resolves
// every name beneath it, never following a link. Names are
// slash-separated and relative; missing parent directories are made with
// opts.DirMode. Files are created exclusively (a name that exists fails
// the write), given their mode and opts.GID through their descriptor and
// fsync'd. The writer never outlives Write: it is killed when ctx ends
// (and when the driver dies: PR_SET_PDEATHSIG) and
// reaped before Write returns. What it was writing when it failed is left
// in dir for the caller to remove.
//
// On v2 the writer is in all the pod's controllers, not only memory: it
// counts against the pod's pids limit (a pod at it cannot get a writer
// started) and runs within its CPU quota (a pod throttled to a few
// millicores writes its own files slowly, within ctx). On v1 it joins
// only the pod's memory cgroup. Before it is the pod's, on v1, the
// writer's runtime start-up (not the files) is charged to the driver's
// cgroup, and given back when it exits.
//
// Errors: ErrBadFiles (before anything starts), ErrNoSpace (the
// filesystem is full), ErrPodOutOfMemory (the pod's memory cgroup is at
// its limit: the writer was refused memory or OOM-killed), ctx's error,
// one that is fs.ErrNotExist when the pod's cgroup is gone since Find (the
// pod went away), or another failure described. File contents never
// appear in an error.
func (c *Cgroup) Write(ctx context.Context, dir *os.File, files map[string]File, opts WriteOptions) (res Result, err error) {
	entries, data, err := plan(files, opts.Limits)
	if err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	req := request{gid: -1, dirMode: opts.DirMode.Perm(), sync: true, files: entries}
	if req.dirMode == 0 {
		req.dirMode = 0o755
	}
	if opts.GID != nil {
		req.gid = int(*opts.GID)
	}
	if d, ok := ctx.Deadline(); ok {
		req.deadline = d.UnixNano()
	}
	oomBefore := c.oomKills()

	// Where the writer goes: born into a leaf (v2), or moved into procs
	// once started (v1; v2 without clone3).
	var procs string
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	switch c.Version {
	case V1:
		procs = filepath.Join(c.Dir, "cgroup.procs")
	case V2:
		leaf, err := makeLeaf(c.Dir)
		if err != nil {
			return res, fmt.Errorf("pod %s: making the writer's cgroup: %w", c.UID, err)
		}
		res.Leaf = leaf
		defer func() { res.LeafLeft = removeLeaf(leaf) }()
		fd, err := unix.Open(leaf, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return res, fmt.Errorf("pod %s: opening the writer's cgroup: %w", c.UID, err)
		}
		defer unix.Close(fd)
		attr.UseCgroupFD = true
		attr.CgroupFD = fd
	default:
		return res, fmt.Errorf("pod %s: %w: cgroup version %v", c.UID, ErrUnsupported, c.Version)
	}

	start := time.Now()
	var cmd *exec.Cmd
	var stdin *os.File
	var out, errOut *boundedBuffer
	fallback := attr.UseCgroupFD && noCloneIntoCgroup
	if !fallback {
		cmd, stdin, out, errOut, err = startWriter(ctx, dir, attr)
		fallback = err != nil && attr.UseCgroupFD && errors.Is(err, unix.ENOSYS)
	}
	if fallback {
		// A kernel before 5.7 (no clone3): start it in this cgroup and
		// move it, as on v1.
		attr.UseCgroupFD = false
		procs = filepath.Join(res.Leaf, "cgroup.procs")
		cmd, stdin, out, errOut, err = startWriter(ctx, dir, attr)
	}
	if err != nil {
		hint := ""
		if attr.UseCgroupFD && errors.Is(err, unix.ENOENT) {
			// nsdelegate (systemd mounts cgroup2 with it): a process
			// may move others only within its cgroup namespace. A
			// privileged container runs in the host's (containerd/cri
			// #1415), an unprivileged one in its own.
			hint = " (with cgroup2's nsdelegate a process moves others only within its cgroup namespace: the driver's container must be privileged, or otherwise in the host's cgroup namespace)"
		}
		return res, fmt.Errorf("pod %s: starting the writer: %w%s", c.UID, err, hint)
	}
	res.Pid = cmd.Process.Pid
	var sendErr error
	if procs != "" {
		// The pod's OOM killer's preferred victim before it can allocate
		// there (the writer also says so itself, once its runtime is up).
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid), []byte("1000"), 0)
		if err := join(procs, cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			sendErr = fmt.Errorf("moving the writer into %s: %w", procs, err)
		}
	}
	if sendErr == nil && afterStart != nil {
		afterStart(cmd.Process.Pid)
	}
	if sendErr == nil {
		sendErr = send(stdin, req.encode(), data)
	}
	_ = stdin.Close()
	waitErr := cmd.Wait()
	res.Elapsed = time.Since(start)
	return res, c.outcome(ctx, sendErr, waitErr, out.String(), errOut.String(), oomBefore)
}

// noCloneIntoCgroup makes Write start a v2 writer as it does on a kernel
// without clone3, and move it into its leaf: a test hook.
var noCloneIntoCgroup bool

// afterStart, when set, is called with the writer's pid once it is in its
// cgroup, before it is sent anything: a test hook.
var afterStart func(pid int)

// startWriter starts the writer with dir as its descriptor 3 and returns
// it with the write end of its standard input and its bounded outputs.
func startWriter(ctx context.Context, dir *os.File, attr *syscall.SysProcAttr) (*exec.Cmd, *os.File, *boundedBuffer, *boundedBuffer, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer r.Close() // the writer has its copy
	out, errOut := &boundedBuffer{}, &boundedBuffer{}
	cmd := exec.CommandContext(ctx, selfExe)
	cmd.Args = []string{writerArg0}
	// Nothing of the driver's environment: the marker, and one P (the
	// writer is one loop of system calls).
	// GORACE: a race-detector build (tests) would sleep a second at exit.
	cmd.Env = []string{writerEnv + "=" + writerEnvValue, "GOMAXPROCS=1", "GORACE=atexit_sleep_ms=0"}
	cmd.Dir = "/"
	cmd.Stdin = r
	cmd.Stdout = out
	cmd.Stderr = errOut
	cmd.ExtraFiles = []*os.File{dir}
	cmd.SysProcAttr = attr
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, nil, nil, nil, err
	}
	return cmd, w, out, errOut, nil
}

// send writes the header and the files' data to the writer's standard
// input.
func send(w io.Writer, header []byte, data [][]byte) error {
	if _, err := w.Write(header); err != nil {
		return err
	}
	for _, d := range data {
		if _, err := w.Write(d); err != nil {
			return err
		}
	}
	return nil
}

// outcome turns how the writer ended into Write's error.
func (c *Cgroup) outcome(ctx context.Context, sendErr, waitErr error, out, errOut string, oomBefore int64) error {
	status := strings.TrimSpace(out)
	if waitErr == nil && status == "ok" {
		return nil
	}
	prefix := "pod " + c.UID + ": the writer"
	if rest, ok := strings.CutPrefix(status, "error "); ok {
		num, msg, _ := strings.Cut(rest, " ")
		errno, _ := strconv.Atoi(num)
		switch syscall.Errno(errno) {
		case unix.ENOSPC, unix.EDQUOT:
			return fmt.Errorf("%s: %w: %s", prefix, ErrNoSpace, msg)
		case unix.ENOMEM:
			return fmt.Errorf("%s: %w: %s", prefix, ErrPodOutOfMemory, msg)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w: %s", prefix, context.Cause(ctx), msg)
		}
		return fmt.Errorf("%s: %s", prefix, msg)
	}
	if sendErr != nil && !errors.Is(sendErr, syscall.EPIPE) {
		return fmt.Errorf("pod %s: %w", c.UID, sendErr)
	}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			if ctx.Err() != nil {
				return fmt.Errorf("%s was killed at the end of its context: %w", prefix, context.Cause(ctx))
			}
			if after := c.oomKills(); ws.Signal() == syscall.SIGKILL && oomBefore >= 0 && after > oomBefore {
				return fmt.Errorf("%s was killed by the pod cgroup's OOM killer (its oom_kill count %d → %d): %w", prefix, oomBefore, after, ErrPodOutOfMemory)
			}
			return fmt.Errorf("%s was killed by %v%s", prefix, ws.Signal(), tail(errOut))
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", prefix, context.Cause(ctx))
	}
	if waitErr == nil {
		waitErr = fmt.Errorf("no status (%q)", clip(status))
	}
	return fmt.Errorf("%s: %w%s", prefix, waitErr, tail(errOut))
}

// tail is ": " and the first line of a writer's stderr, "" when empty.
func tail(errOut string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(errOut), "\n")
	if line == "" {
		return ""
	}
	return ": " + clip(line)
}

// oomKills reads the kernel's count of OOM kills in the pod's memory cgroup
// (v1 memory.oom_control, v2 memory.events, both counting its
// descendants'), -1 when it cannot.
func (c *Cgroup) oomKills() int64 {
	file := "memory.events"
	if c.Version == V1 {
		file = "memory.oom_control"
	}
	n, err := readKey(filepath.Join(c.Dir, file), "oom_kill")
	if err != nil {
		return -1
	}
	return n
}

// readKey returns the value of key in a cgroup file of "key value" lines.
func readKey(file, key string) (int64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", file, key)
}

// join moves the process pid (all its threads) into the cgroup whose
// cgroup.procs is procs. The kernel moves it before the write returns.
func join(procs string, pid int) error {
	f, err := os.OpenFile(procs, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(pid))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// makeLeaf makes a writer's leaf cgroup below the pod's cgroup dir. It is
// a plain directory with either cgroup driver: a systemd transient scope
// would take a D-Bus call to PID 1 from the driver's container per write
// and leave a unit behind a killed driver, and the leaf's name says it is
// no unit (no .scope suffix), so systemd counts the writer as the pod
// slice's and removes the leaf, if it is ever left, with the slice.
func makeLeaf(dir string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	leaf := filepath.Join(dir, leafPrefix+hex.EncodeToString(b[:]))
	if err := os.Mkdir(leaf, 0o755); err != nil {
		return "", err
	}
	return leaf, nil
}

// removeLeaf removes a writer's leaf cgroup once its writer is reaped. The
// kernel may still count the dead writer in it for a moment (EBUSY): a
// few tries, about a second in all.
func removeLeaf(leaf string) error {
	delay := time.Millisecond
	for i := 0; ; i++ {
		err := unix.Rmdir(leaf)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || i >= 10 {
			return fmt.Errorf("removing the writer's cgroup %s: %w", leaf, err)
		}
		time.Sleep(delay)
		delay *= 2
	}
}

// boundedBuffer keeps the first outputLimit bytes written to it.
type boundedBuffer struct{ b bytes.Buffer }

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := outputLimit - b.b.Len(); room > 0 {
		b.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string { return b.b.String() }
