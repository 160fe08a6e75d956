package exepages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Release releases the pages of the executable's read-only file mappings of
// this process.
func Release() (Result, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return Result{}, fmt.Errorf("finding the executable: %w", err)
	}
	maps, err := readMaps(exe)
	if err != nil {
		return Result{}, err
	}
	res := Result{ResidentBefore: resident(maps)}
	for _, m := range maps {
		if m.writable {
			continue
		}
		for _, advice := range []uintptr{unix.MADV_RANDOM, unix.MADV_PAGEOUT} {
			// The addresses are the kernel's, from smaps: no Go memory is
			// passed, so no unsafe.Pointer either.
			if _, _, errno := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, advice); errno != 0 {
				if errno == unix.EINVAL && advice == unix.MADV_PAGEOUT {
					// An older kernel: the mapping reads ahead again as before.
					unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_NORMAL)
					return res, fmt.Errorf("%w: madvise(MADV_PAGEOUT): %v (Linux 5.4 or later)", ErrUnsupported, errno)
				}
				return res, fmt.Errorf("madvise(%d) of %s at %#x: %w", advice, exe, m.start, errno)
			}
		}
		res.Mappings++
	}
	if res.Mappings == 0 {
		return res, fmt.Errorf("no read-only mapping of %s in /proc/self/smaps", exe)
	}
	after, err := readMaps(exe)
	if err != nil {
		return res, err
	}
	res.ResidentAfter = resident(after)
	return res, nil
}

// readMaps returns the mappings of path in /proc/self/smaps.
func readMaps(path string) ([]mapping, error) {
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/smaps: %w", err)
	}
	return parseSmaps(data, path)
}
