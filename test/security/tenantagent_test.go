//go:build linux

package security

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// A tenant agent is a "pod" of TestTenantActions: this test binary
// re-executed in the pod's memory cgroup (envTenantAgent set), doing what
// the test asks of it to the pod's volumes, as a container of the pod
// would: its writes are charged to the pod's cgroup, and what it holds open
// it holds until it exits (it is killed when the pod is deleted). It reads
// one agentOp per line on its standard input and answers each with one
// agentReply per line.

// envTenantAgent marks a process as a tenant agent (TestMain).
const envTenantAgent = "EPHEMERA_TENANT_AGENT"

// agentOp is one thing a tenant agent does.
type agentOp struct {
	// Op is one of:
	//   - link: a hard link to Path at To;
	//   - hold: open Path for reading and keep it open until the agent exits;
	//   - rename: Path to To;
	//   - sparse: make Path (and its parents), N bytes long, no page written;
	//   - fill: write Path up to N bytes, in 64 KiB writes, until a write
	//     fails (the reply says how far it came: Count bytes);
	//   - tree: below Path, a chain of N directories and a directory of M
	//     empty files, until one fails (Count entries made);
	//   - symlink: a symbolic link at Path to To, replacing what is there;
	//   - read: Path's content (Data, at most 4 KiB).
	Op   string `json:"op"`
	Path string `json:"path"`
	To   string `json:"to,omitempty"`
	N    int64  `json:"n,omitempty"`
	M    int64  `json:"m,omitempty"`
}

// agentReply is an agent's answer to one agentOp.
type agentReply struct {
	Err   string `json:"err,omitempty"`
	Errno int    `json:"errno,omitempty"` // the errno of Err, 0 when none or not a system call's
	Count int64  `json:"count,omitempty"`
	Data  string `json:"data,omitempty"`
}

// tenantAgentMain serves ops until its input ends, and returns the exit
// status.
func tenantAgentMain() int {
	var held []*os.File
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var op agentOp
		if err := json.Unmarshal(in.Bytes(), &op); err != nil {
			fmt.Fprintf(os.Stderr, "tenant agent: %v\n", err)
			return 2
		}
		var r agentReply
		err := op.do(&r, &held)
		if err != nil {
			r.Err = err.Error()
			var errno syscall.Errno
			if errors.As(err, &errno) {
				r.Errno = int(errno)
			}
		}
		if err := out.Encode(r); err != nil {
			return 1
		}
	}
	return 0
}

func (op agentOp) do(r *agentReply, held *[]*os.File) error {
	switch op.Op {
	case "link":
		return os.Link(op.Path, op.To)
	case "hold":
		f, err := os.Open(op.Path)
		if err == nil {
			*held = append(*held, f)
		}
		return err
	case "rename":
		return os.Rename(op.Path, op.To)
	case "sparse":
		if err := os.MkdirAll(filepath.Dir(op.Path), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(op.Path, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Truncate(op.N)
	case "fill":
		f, err := os.OpenFile(op.Path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		buf := make([]byte, 64<<10)
		for i := range buf {
			buf[i] = byte(i)
		}
		for r.Count < op.N {
			n, err := f.Write(buf[:min(int64(len(buf)), op.N-r.Count)])
			r.Count += int64(n)
			if err != nil {
				return err
			}
		}
		return nil
	case "tree":
		deep := filepath.Join(op.Path, "deep")
		for i := int64(0); i < op.N; i++ {
			if err := os.Mkdir(deep, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			r.Count++
			deep = filepath.Join(deep, "d")
		}
		wide := filepath.Join(op.Path, "wide")
		if err := os.Mkdir(wide, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		for i := int64(0); i < op.M; i++ {
			f, err := os.Create(filepath.Join(wide, strconv.FormatInt(i, 10)))
			if err != nil {
				return err
			}
			f.Close()
			r.Count++
		}
		return nil
	case "symlink":
		if err := os.RemoveAll(op.Path); err != nil {
			return err
		}
		return os.Symlink(op.To, op.Path)
	case "read":
		f, err := os.Open(op.Path)
		if err != nil {
			return err
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, 4<<10))
		r.Data = string(b)
		return err
	}
	return fmt.Errorf("unknown op %q", op.Op)
}
