//go:build linux

package loop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/failpoint"
	"github.com/ephemera-csi/ephemera/framework/stamp"
)

// Kernel interfaces; variables so that tests could point them elsewhere.
var (
	sysBlock    = "/sys/block"
	devDir      = "/dev"
	loopControl = "/dev/loop-control"
)

// attachRetries bounds LOOP_CTL_GET_FREE/LOOP_CONFIGURE rounds lost to other
// processes configuring the same free device.
const attachRetries = 16

// dir returns Options.Dir with symbolic links resolved, as the kernel reports
// backing files in sysfs.
func (b *Backend) dir() string {
	if d, err := filepath.EvalSymlinks(b.opts.Dir); err == nil {
		return d
	}
	return b.opts.Dir
}

func (b *Backend) file(id string) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	return filepath.Join(b.dir(), id+imgExt), nil
}

// Create provisions the backing file, attaches a loop device and formats it if
// it holds no filesystem yet. Every step reuses what an earlier, interrupted call
// left behind.
func (b *Backend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	fsType, err := b.fsType(v)
	if err != nil {
		return api.Source{}, err
	}
	size, err := b.size(v, fsType)
	if err != nil {
		return api.Source{}, err
	}
	root, err := b.root(v, fsType)
	if err != nil {
		return api.Source{}, err
	}
	if err := os.MkdirAll(b.opts.Dir, 0o700); err != nil {
		return api.Source{}, fmt.Errorf("creating loop backend directory: %w", err)
	}
	path, err := b.file(v.ID)
	if err != nil {
		return api.Source{}, err
	}

	// (1) The sparse backing file.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return api.Source{}, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return api.Source{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	switch st.Size {
	case size:
	case 0: // new, or created by a call that stopped before truncating
		if err := unix.Ftruncate(fd, size); err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EFBIG) {
				return api.Source{}, fmt.Errorf("%w: sizing backing file %s to %d bytes: %v", api.ErrResourceExhausted, path, size, err)
			}
			return api.Source{}, &fs.PathError{Op: "truncate", Path: path, Err: err}
		}
	default:
		return api.Source{}, fmt.Errorf("backing file %s has %d bytes, expected %d; it belongs to another incarnation of volume %s: unpublish it first", path, st.Size, size, v.ID)
	}

	failpoint.Hit(FailpointAfterFile)

	if b.opts.Preallocate {
		// Allocates only what is still a hole: cheap to repeat.
		if err := unix.Fallocate(fd, 0, 0, size); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return api.Source{}, fmt.Errorf("%w: preallocating %s for backing file %s: %v", api.ErrResourceExhausted, human(size), path, err)
			}
			return api.Source{}, &fs.PathError{Op: "fallocate", Path: path, Err: err}
		}
	}

	// (2) The loop device.
	devs, err := b.devices(path, &st)
	if err != nil {
		return api.Source{}, err
	}
	var dev string
	for _, d := range devs {
		if d.current {
			dev = d.dev
			break
		}
	}
	if dev == "" {
		if dev, err = attach(fd, path, !b.opts.BufferedIO); err != nil {
			return api.Source{}, err
		}
	}

	failpoint.Hit(FailpointAfterAttach)

	// (3) The filesystem.
	found, err := probe(dev)
	if err != nil {
		return api.Source{}, err
	}
	switch found {
	case "":
		if err := b.mkfs(ctx, fsType, dev, root); err != nil {
			return api.Source{}, err
		}
	case fsType:
	default:
		return api.Source{}, fmt.Errorf("%s (backing file %s) already holds %s, not %s; refusing to reformat it", dev, path, found, fsType)
	}
	failpoint.Hit(FailpointAfterMkfs)
	v.State = map[string]string{"device": dev, "file": path}
	return api.Source{Path: dev, FSType: fsType}, nil
}

// mkfs formats dev and sets its root directory's owner and mode.
func (b *Backend) mkfs(ctx context.Context, fsType, dev string, root rootAttrs) error {
	if fsType == FSXFS {
		bin, err := program(b.opts.MkfsXFS, "mkfs.xfs", "xfsprogs")
		if err != nil {
			return err
		}
		proto, err := os.CreateTemp(b.opts.Dir, ".proto-*")
		if err != nil {
			return err
		}
		defer os.Remove(proto.Name())
		_, err = proto.WriteString(xfsProto(root))
		if cerr := proto.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return run(ctx, bin, mkfsArgs(fsType, dev, proto.Name(), root)...)
	}
	bin, err := program(b.opts.MkfsExt4, "mkfs.ext4", "e2fsprogs")
	if err != nil {
		return err
	}
	if err := run(ctx, bin, mkfsArgs(fsType, dev, "", root)...); err != nil {
		return err
	}
	if args := debugfsArgs(dev, root); args != nil {
		bin, err := program(b.opts.Debugfs, "debugfs", "e2fsprogs")
		if err != nil {
			return err
		}
		return run(ctx, bin, args...)
	}
	return nil
}

// program returns the configured path or looks name up in PATH.
func program(configured, name, pkg string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not installed on the node (package %s): %v", api.ErrUnavailable, name, pkg, err)
	}
	return p, nil
}

// run runs a formatting program; its error carries the program's output.
func run(ctx context.Context, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 512 {
			msg = msg[:512] + "..."
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w (%v)", filepath.Base(bin), strings.Join(args, " "), ctx.Err(), err)
		}
		if msg == "" {
			return fmt.Errorf("%s %s: %w", filepath.Base(bin), strings.Join(args, " "), err)
		}
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, msg)
	}
	return nil
}

// probe reads the start of dev and reports the filesystem on it.
func probe(dev string) (string, error) {
	f, err := os.Open(dev)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, superblockProbe)
	n, err := f.ReadAt(buf, 0)
	if n < len(buf) && err != nil {
		return "", fmt.Errorf("reading superblock of %s: %w", dev, err)
	}
	return detectFS(buf), nil
}

// loopDev is a loop device bound to a volume's backing file.
type loopDev struct {
	dev string // /dev/loopN
	// current is true when the device is bound to the backing file that is now
	// at the volume's path (same device and inode); false for a device bound to
	// an earlier, deleted file of that path.
	current bool
}

// devices returns the loop devices bound to the file at path: by the path the
// kernel reports (with or without " (deleted)"), and, when st is set, by device
// and inode (LOOP_GET_STATUS64), which also finds devices whose path the kernel
// reports differently (the file opened in another mount namespace).
func (b *Backend) devices(path string, st *unix.Stat_t) ([]loopDev, error) {
	loops, err := attachedLoops()
	if err != nil {
		return nil, err
	}
	var out []loopDev
	for _, l := range loops {
		dev := filepath.Join(devDir, l.name)
		pathMatch := l.backing == path
		if st == nil {
			if pathMatch {
				out = append(out, loopDev{dev: dev})
			}
			continue
		}
		info, err := status(dev)
		if err != nil {
			if pathMatch {
				out = append(out, loopDev{dev: dev})
			}
			continue // detached meanwhile, or not ours
		}
		inodeMatch := info.Device == st.Dev && info.Inode == st.Ino
		if pathMatch || inodeMatch {
			out = append(out, loopDev{dev: dev, current: inodeMatch})
		}
	}
	return out, nil
}

// attachedLoop is one bound loop device from sysfs.
type attachedLoop struct {
	name    string // loopN
	backing string // path of the backing file, without " (deleted)"
	deleted bool
}

// attachedLoops lists bound loop devices: unbound ones have no loop/backing_file.
func attachedLoops() ([]attachedLoop, error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, err
	}
	var out []attachedLoop
	for _, e := range entries {
		if !isLoopName(e.Name()) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if err != nil {
			continue // unbound, or detached meanwhile
		}
		p, deleted := parseBackingFile(string(data))
		out = append(out, attachedLoop{name: e.Name(), backing: p, deleted: deleted})
	}
	return out, nil
}

func status(dev string) (*unix.LoopInfo64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return unix.IoctlLoopGetStatus64(fd)
}

// attach binds a free loop device to the open backing file.
func attach(backing int, path string, directIO bool) (string, error) {
	ctl, err := unix.Open(loopControl, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("opening %s (is the loop module loaded and /dev mounted?): %w", loopControl, err)
	}
	defer unix.Close(ctl)
	var lastErr error
	for range attachRetries {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("%w: no free loop device (LOOP_CTL_GET_FREE): %v", api.ErrResourceExhausted, err)
		}
		dev, fd, err := openLoop(n)
		if err != nil {
			return "", err
		}
		cfg := unix.LoopConfig{Fd: uint32(backing)}
		copy(cfg.Info.File_name[:], loFileName(path))
		if directIO {
			cfg.Info.Flags = unix.LO_FLAGS_DIRECT_IO
		}
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if errors.Is(err, unix.EINVAL) && directIO {
			// The backing filesystem cannot do direct I/O: fall back to buffered.
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(fd, &cfg)
		}
		unix.Close(fd)
		switch {
		case err == nil:
			return dev, nil
		case errors.Is(err, unix.EBUSY):
			lastErr = err // another process bound it first; ask again
			continue
		default:
			return "", fmt.Errorf("attaching %s to %s (LOOP_CONFIGURE): %w", path, dev, err)
		}
	}
	return "", fmt.Errorf("%w: attaching %s: lost the race for a free loop device %d times: %v", api.ErrUnavailable, path, attachRetries, lastErr)
}

// openLoop opens /dev/loopN, creating the device node when /dev is not a
// devtmpfs (a container's /dev).
func openLoop(n int) (string, int, error) {
	name := "loop" + strconv.Itoa(n)
	dev := filepath.Join(devDir, name)
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if merr := mknodLoop(name, dev); merr != nil {
			return "", -1, fmt.Errorf("opening %s: %w; creating it: %v", dev, err, merr)
		}
		fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return "", -1, &fs.PathError{Op: "open", Path: dev, Err: err}
	}
	return dev, fd, nil
}

func mknodLoop(name, dev string) error {
	data, err := os.ReadFile(filepath.Join(sysBlock, name, "dev"))
	if err != nil {
		return err
	}
	maj, min, ok := strings.Cut(strings.TrimSpace(string(data)), ":")
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("unexpected %s/%s/dev: %q", sysBlock, name, data)
	}
	err = unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(uint32(ma), uint32(mi))))
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// detach unbinds dev. The device is opened exclusively first: that fails with
// EBUSY while a filesystem on it is mounted (LOOP_CLR_FD itself would succeed
// and only detach at the last close).
func detach(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENXIO):
		return nil
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%w: loop device %s is still in use (its filesystem is mounted somewhere); unmount it first", api.ErrBusy, dev)
	case err != nil:
		return &fs.PathError{Op: "open", Path: dev, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%w: detaching loop device %s: %v", api.ErrBusy, dev, err)
		}
		return fmt.Errorf("detaching loop device %s (LOOP_CLR_FD): %w", dev, err)
	}
	return nil
}

// Delete detaches every loop device bound to the volume's backing file (also
// one whose file was deleted) and removes the file. It needs only v.ID.
func (b *Backend) Delete(_ context.Context, v *api.Volume) error {
	path, err := b.file(v.ID)
	if err != nil {
		return err
	}
	var stp *unix.Stat_t
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		stp = &st
	} else if !errors.Is(err, unix.ENOENT) {
		return &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	devs, err := b.devices(path, stp)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range devs {
		if err := detach(d.dev); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err // keep the file: the data is still mounted somewhere
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// List returns the IDs of the backing files in Dir and of loop devices bound
// to a file of Dir that no longer exists, so the reconcile detaches them.
func (b *Backend) List(context.Context) ([]string, error) {
	ids := map[string]bool{}
	dir := b.dir()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if id := idOfName(e.Name()); id != "" && e.Type().IsRegular() {
			ids[id] = true
		}
	}
	loops, err := attachedLoops()
	if err != nil {
		return nil, err
	}
	for _, l := range loops {
		if id := volumeIDOf(dir, l.backing); id != "" {
			ids[id] = true
		}
	}
	return sortedIDs(ids), nil
}

// Find returns the loop device bound to the volume's backing file, with the
// filesystem on it; api.ErrNotFound when there is no backing file or no
// device bound to it (storage that cannot be mounted as it is).
func (b *Backend) Find(_ context.Context, v *api.Volume) (api.Source, error) {
	path, err := b.file(v.ID)
	if err != nil {
		return api.Source{}, err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return api.Source{}, fmt.Errorf("%w: no backing file for volume %s", api.ErrNotFound, v.ID)
		}
		return api.Source{}, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	devs, err := b.devices(path, &st)
	if err != nil {
		return api.Source{}, err
	}
	for _, d := range devs {
		if !d.current {
			continue
		}
		fsType, err := probe(d.dev)
		if err != nil {
			return api.Source{}, err
		}
		return api.Source{Path: d.dev, FSType: fsType}, nil
	}
	return api.Source{}, fmt.Errorf("%w: no loop device is attached to %s", api.ErrNotFound, path)
}

// Stamp returns the state store identity stamped in Dir.
func (b *Backend) Stamp(context.Context) (string, error) { return stamp.Read(b.opts.Dir) }

// SetStamp stamps Dir with the state store's identity.
func (b *Backend) SetStamp(_ context.Context, id string) error { return stamp.Write(b.opts.Dir, id) }

// Check reports an error when the volume's backing file is gone or no loop
// device is bound to it.
func (b *Backend) Check(_ context.Context, v *api.Volume) error {
	path, err := b.file(v.ID)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("backing file %s: %w", path, err)
	}
	devs, err := b.devices(path, &st)
	if err != nil {
		return err
	}
	for _, d := range devs {
		if d.current {
			return nil
		}
	}
	return fmt.Errorf("no loop device is attached to backing file %s", path)
}
