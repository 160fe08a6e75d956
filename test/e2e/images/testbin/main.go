//go:build linux

// Command testbin is the only program inside the e2e test images. It runs a list of
// steps separated by "--" and prints one result line per step, so the tests can
// assert on the container's own view of a volume:
//
//	testbin write FILE BYTES -- read FILE -- ls DIR -- stat DIR -- sleep
//
// Steps:
//
//	write FILE BYTES   create FILE with BYTES bytes of a repeating pattern
//	append FILE TEXT   append TEXT and a newline to FILE
//	read FILE          print FILE's size and sha256 (and content when short text)
//	cat FILE           print FILE's size and whole content (quoted), e.g. a token or /proc/self/mountinfo
//	ls DIR             list DIR
//	rm FILE            remove FILE
//	stat PATH          print PATH's permission bits, uid and gid
//	statfs DIR         print the filesystem size of DIR
//	sleep [SECONDS]    sleep (forever without an argument)
//	hold FILE          open FILE every 20ms and keep open each file it finds there that
//	                   it did not hold yet (a new inode: a refreshed content volume's
//	                   next generation), forever; one line per file held
//	pause              same as sleep forever; also the entrypoint of the pause image
//
// Each step prints "STEP <n> <verb> ok ..." or "STEP <n> <verb> err <errno name>: <error>";
// a failed step does not stop the following steps. The exit status is 0.
package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		args = []string{"pause"}
	}
	var steps [][]string
	cur := []string{}
	for _, a := range args {
		if a == "--" {
			steps = append(steps, cur)
			cur = []string{}
			continue
		}
		cur = append(cur, a)
	}
	steps = append(steps, cur)
	for i, s := range steps {
		if len(s) == 0 {
			continue
		}
		if s[0] == "hold" && len(s) == 2 {
			hold(i, s[1])
		}
		out, err := run(s)
		if err != nil {
			fmt.Printf("STEP %d %s err %s: %v\n", i, s[0], errnoName(err), err)
			continue
		}
		fmt.Printf("STEP %d %s ok %s\n", i, s[0], out)
	}
}

func run(s []string) (string, error) {
	need := func(n int) error {
		if len(s) < n+1 {
			return fmt.Errorf("%s needs %d arguments", s[0], n)
		}
		return nil
	}
	switch s[0] {
	case "write":
		if err := need(2); err != nil {
			return "", err
		}
		n, err := strconv.ParseInt(s[2], 10, 64)
		if err != nil {
			return "", err
		}
		return write(s[1], n)
	case "append":
		if err := need(2); err != nil {
			return "", err
		}
		f, err := os.OpenFile(s[1], os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return "", err
		}
		if _, err := f.WriteString(s[2] + "\n"); err != nil {
			f.Close()
			return "", err
		}
		return s[1], f.Close()
	case "read":
		if err := need(1); err != nil {
			return "", err
		}
		b, err := os.ReadFile(s[1])
		if err != nil {
			return "", err
		}
		out := fmt.Sprintf("size=%d sha256=%x", len(b), sha256.Sum256(b))
		if len(b) <= 200 && isText(b) {
			out += " content=" + strconv.Quote(string(b))
		}
		return out, nil
	case "cat":
		if err := need(1); err != nil {
			return "", err
		}
		b, err := os.ReadFile(s[1])
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("size=%d content=%s", len(b), strconv.Quote(string(b))), nil
	case "ls":
		if err := need(1); err != nil {
			return "", err
		}
		ents, err := os.ReadDir(s[1])
		if err != nil {
			return "", err
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		return "entries=" + strings.Join(names, ","), nil
	case "rm":
		if err := need(1); err != nil {
			return "", err
		}
		return s[1], os.Remove(s[1])
	case "stat":
		if err := need(1); err != nil {
			return "", err
		}
		var st syscall.Stat_t
		if err := syscall.Stat(s[1], &st); err != nil {
			return "", err
		}
		return fmt.Sprintf("mode=%04o uid=%d gid=%d", st.Mode&0o7777, st.Uid, st.Gid), nil
	case "statfs":
		if err := need(1); err != nil {
			return "", err
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(s[1], &st); err != nil {
			return "", err
		}
		return fmt.Sprintf("type=0x%x size=%d", st.Type, uint64(st.Blocks)*uint64(st.Bsize)), nil
	case "sleep":
		if len(s) > 1 {
			d, err := strconv.Atoi(s[1])
			if err != nil {
				return "", err
			}
			time.Sleep(time.Duration(d) * time.Second)
			return s[1], nil
		}
		fallthrough
	case "pause":
		fmt.Printf("STEP - %s ok waiting\n", s[0])
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
		os.Exit(0)
	}
	return "", fmt.Errorf("unknown step %q", s[0])
}

// hold opens name every 20 ms and keeps each file it finds there that it
// does not hold yet open until SIGTERM, as a pod that keeps every
// generation of a refreshed token open does: the files' pages stay alive
// after the content's refresh removed them. For each one it prints "STEP
// <step> hold ok held=<files held> ino=<inode> size=<bytes> head=<first
// line, quoted>"; a failed open is printed once per error.
func hold(step int, name string) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	fmt.Printf("STEP - hold ok waiting\n")
	tick := time.NewTicker(20 * time.Millisecond)
	var held []*os.File
	seen := map[uint64]bool{}
	lastErr := ""
	for {
		select {
		case <-ch:
			os.Exit(0)
		case <-tick.C:
		}
		f, err := os.Open(name)
		if err != nil {
			if e := err.Error(); e != lastErr {
				lastErr = e
				fmt.Printf("STEP %d hold err %s: %v\n", step, errnoName(err), err)
			}
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil || seen[st.Ino] {
			f.Close()
			continue
		}
		seen[st.Ino] = true
		held = append(held, f)
		head := make([]byte, 200)
		n, _ := f.ReadAt(head, 0)
		head = head[:n]
		if i := bytes.IndexByte(head, '\n'); i >= 0 {
			head = head[:i]
		}
		fmt.Printf("STEP %d hold ok held=%d ino=%d size=%d head=%s\n", step, len(held), st.Ino, st.Size, strconv.Quote(string(head)))
	}
}

func write(name string, n int64) (string, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return "", err
	}
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	h := sha256.New()
	var done int64
	for done < n {
		chunk := buf
		if rem := n - done; rem < int64(len(chunk)) {
			chunk = chunk[:rem]
		}
		w, err := f.Write(chunk)
		h.Write(chunk[:w])
		done += int64(w)
		if err != nil {
			f.Close()
			return "", fmt.Errorf("after %d bytes: %w", done, err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s size=%d sha256=%x", name, n, h.Sum(nil)), nil
}

func isText(b []byte) bool {
	for _, c := range b {
		if c < 0x20 && c != '\n' && c != '\t' || c > 0x7e {
			return false
		}
	}
	return true
}

// errnoName returns the symbolic errno (ENOSPC, EROFS, ...) wrapped in err, or "-".
func errnoName(err error) string {
	var en syscall.Errno
	if errors.As(err, &en) {
		switch en {
		case syscall.ENOSPC:
			return "ENOSPC"
		case syscall.EROFS:
			return "EROFS"
		case syscall.ENOENT:
			return "ENOENT"
		case syscall.EACCES:
			return "EACCES"
		case syscall.EPERM:
			return "EPERM"
		case syscall.EDQUOT:
			return "EDQUOT"
		}
		return fmt.Sprintf("errno%d", int(en))
	}
	return "-"
}
