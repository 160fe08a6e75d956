package exepages

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRelease releases this test binary's pages and reads the result back
// from /proc/self/smaps: the read-only mappings are marked for random reads
// ("rr" in VmFlags) and hold fewer resident pages; the writable one is left
// as it was.
func TestRelease(t *testing.T) {
	if os.Geteuid() != 0 {
		// The kernel pages out a file's pages only for its owner or a writer
		// (or CAP_FOWNER): the test binary is root's when tests run as root.
		t.Skip("needs root")
	}
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(exe, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		// tmpfs pages are memory: without swap the kernel keeps them.
		t.Skipf("%s is on tmpfs (GOTMPDIR): its pages cannot be paged out", exe)
	}
	// A binary just linked may still have dirty pages, which MADV_PAGEOUT
	// leaves in the page cache: write them back first.
	if f, err := os.Open(exe); err != nil {
		t.Fatal(err)
	} else {
		err = f.Sync()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	res, err := Release()
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	t.Logf("Release: %d mappings, %d KiB resident before, %d KiB after", res.Mappings, res.ResidentBefore>>10, res.ResidentAfter>>10)
	if res.Mappings < 1 {
		t.Errorf("Release released %d mappings, want at least the code's", res.Mappings)
	}
	// Running the test touches some code again: a quarter is plenty.
	if res.ResidentAfter > res.ResidentBefore/4*3 {
		t.Errorf("resident pages of %s: %d KiB after Release, %d KiB before: want far fewer", exe, res.ResidentAfter>>10, res.ResidentBefore>>10)
	}

	maps, err := readMaps(exe)
	if err != nil {
		t.Fatal(err)
	}
	ro, rw := 0, 0
	for _, m := range maps {
		switch {
		case m.writable && m.randomRead:
			t.Errorf("a writable mapping of %s at %#x is marked for random reads", exe, m.start)
		case m.writable:
			rw++
		case !m.randomRead:
			t.Errorf("a read-only mapping of %s at %#x is not marked for random reads", exe, m.start)
		default:
			ro++
		}
	}
	if ro != res.Mappings {
		t.Errorf("%d read-only mappings marked in smaps, Release said %d", ro, res.Mappings)
	}
	t.Logf("%d read-only and %d writable mappings of %s", ro, rw, exe)
}
