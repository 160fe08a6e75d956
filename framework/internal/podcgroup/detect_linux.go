package podcgroup

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// detect reads the version of the hierarchy mounted at mount from the
// kernel: a cgroup2 mount is v2; a directory (the tmpfs of a v1 or hybrid
// node) whose "memory" is a cgroup (v1) mount is v1, its memory controller
// there; a v1 cgroup mount itself (the memory controller's) is v1 too.
func detect(mount string) (Version, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(mount, &st); err != nil {
		return Detect, fmt.Errorf("%w: cgroup mount %s: %v", ErrUnsupported, mount, err)
	}
	switch st.Type {
	case unix.CGROUP2_SUPER_MAGIC:
		return V2, nil
	case unix.CGROUP_SUPER_MAGIC:
		return Detect, fmt.Errorf("%w: %s is one v1 controller's mount: give the directory that holds the controllers' mounts (its parent)", ErrUnsupported, mount)
	}
	mem := filepath.Join(mount, "memory")
	if err := unix.Statfs(mem, &st); err != nil {
		return Detect, fmt.Errorf("%w: %s is no cgroup2 mount and has no v1 memory controller: %v", ErrUnsupported, mount, err)
	}
	if st.Type != unix.CGROUP_SUPER_MAGIC {
		return Detect, fmt.Errorf("%w: %s is no cgroup2 mount and %s no cgroup (v1) mount (filesystem type %#x)", ErrUnsupported, mount, mem, st.Type)
	}
	return V1, nil
}
