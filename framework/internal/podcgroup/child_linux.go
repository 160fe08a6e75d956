package podcgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// init runs the writer, and exits, in a process started as one (Write):
// before main, so before anything the program does with its command line,
// its flags, its logs or its memory, none of which a writer has. Any
// binary that links this package (every driver built on the framework) is
// therefore its own writer, with nothing to call from its main.
func init() {
	if os.Getenv(writerEnv) == writerEnvValue && filepath.Base(os.Args[0]) == writerArg0 {
		os.Exit(writerMain())
	}
}

// The writer's exit statuses besides 0.
const (
	exitFailed   = 1 // a write failed: the status line says why
	exitRequest  = 2 // the request could not be read
	exitDeadline = 3 // the request's deadline passed
)

// dirFD is the writer's descriptor of the directory it writes in.
const dirFD = 3

// writerMain reads the request on standard input and writes its files
// beneath descriptor 3, then says "ok" or "error <errno> <what>" on
// standard output. Nothing of a file's data is ever printed.
func writerMain() int {
	// The preferred victim of the pod cgroup's OOM killer: a pod at its
	// limit sees this write refused rather than one of its containers
	// killed. Raising one's own score needs no privilege.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0)
	br := bufio.NewReaderSize(os.Stdin, 64<<10)
	req, err := decode(br)
	if err != nil {
		report(err)
		return exitRequest
	}
	if req.deadline != 0 {
		time.AfterFunc(time.Until(time.Unix(0, req.deadline)), func() {
			report(fmt.Errorf("the deadline passed: %w", unix.ETIME))
			os.Exit(exitDeadline)
		})
	}
	w := &childWriter{req: req, dirs: map[string]int{".": dirFD}}
	if err := w.run(br); err != nil {
		report(err)
		return exitFailed
	}
	fmt.Println("ok")
	return 0
}

// report prints a failure's status line: the errno it wraps (0 if none)
// and its text.
func report(err error) {
	var errno syscall.Errno
	errors.As(err, &errno)
	fmt.Printf("error %d %s\n", int(errno), err)
}

// childWriter writes a request's files, resolving each name from the
// directory descriptor one component at a time, never following a link.
type childWriter struct {
	req request
	// dirs are the descriptors of the directories opened so far, by
	// slash-separated name ("." is dirFD).
	dirs map[string]int
	// made are the directories it made, to fsync.
	made []string
}

func (w *childWriter) run(r io.Reader) error {
	for _, f := range w.req.files {
		if err := w.writeFile(r, f); err != nil {
			return fmt.Errorf("writing %s: %w", f.name, err)
		}
	}
	if w.req.sync {
		for i := len(w.made) - 1; i >= 0; i-- {
			if err := unix.Fsync(w.dirs[w.made[i]]); err != nil {
				return fmt.Errorf("syncing %s: %w", w.made[i], err)
			}
		}
		if err := unix.Fsync(dirFD); err != nil {
			return fmt.Errorf("syncing the directory: %w", err)
		}
	}
	return nil
}

// dir returns a descriptor of the directory name, made (with the
// request's mode and group) when it does not exist.
func (w *childWriter) dir(name string) (int, error) {
	if fd, ok := w.dirs[name]; ok {
		return fd, nil
	}
	parent, err := w.dir(path.Dir(name))
	if err != nil {
		return -1, err
	}
	base := path.Base(name)
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(parent, base, flags, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(parent, base, 0o700); err != nil {
			return -1, fmt.Errorf("making %s: %w", name, err)
		}
		if fd, err = unix.Openat(parent, base, flags, 0); err != nil {
			return -1, fmt.Errorf("opening %s: %w", name, err)
		}
		if err := w.setOwner(fd, w.req.dirMode); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: %w", name, err)
		}
		w.made = append(w.made, name)
	} else if err != nil {
		return -1, fmt.Errorf("opening %s: %w", name, err)
	}
	w.dirs[name] = fd
	return fd, nil
}

// setOwner gives what fd is its group (when the request has one) and mode,
// through the descriptor (no umask).
func (w *childWriter) setOwner(fd int, mode os.FileMode) error {
	if w.req.gid >= 0 {
		if err := unix.Fchown(fd, -1, w.req.gid); err != nil {
			return err
		}
	}
	return unix.Fchmod(fd, uint32(mode.Perm()))
}

// writeFile creates f exclusively and copies its data from r.
func (w *childWriter) writeFile(r io.Reader, f entry) error {
	parent, err := w.dir(path.Dir(f.name))
	if err != nil {
		return err
	}
	fd, err := unix.Openat(parent, path.Base(f.name), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	file := os.NewFile(uintptr(fd), f.name)
	defer file.Close()
	if n, err := io.CopyN(file, r, f.size); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("the request ended after %d of %d bytes", n, f.size)
		}
		return err
	}
	if err := w.setOwner(fd, f.mode); err != nil {
		return err
	}
	if w.req.sync {
		if err := file.Sync(); err != nil {
			return err
		}
	}
	return file.Close()
}
