//go:build linux

package content

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
)

// TestChargeIsWhatTmpfsTakes writes file sets into a real tmpfs and checks
// Charge against what the filesystem says it holds: its used pages, and
// InodeCharge for each inode but the root's; after a replacement, the new
// set's charge.
func TestChargeIsWhatTmpfsTakes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	page := int64(os.Getpagesize())
	many := map[string]api.File{}
	for i := range 300 {
		many[fmt.Sprintf("d%d/e%d/f%03d", i%3, i%7, i)] = api.File{Data: []byte(strings.Repeat("x", i*37))}
	}
	sets := []struct {
		name  string
		files map[string]api.File
	}{
		{"one small file", map[string]api.File{"token": {Data: []byte("secret")}}},
		{"empty and page-sized files", map[string]api.File{"empty": {}, "page": {Data: make([]byte, page)}, "page+1": {Data: make([]byte, page+1)}}},
		{"nested directories", many},
		{"a top-level name whose link takes a page", map[string]api.File{strings.Repeat("n", 200) + "/f": {Data: []byte("x")}}},
	}
	for _, s := range sets {
		if err := Write(t.Context(), dir, s.files, Options{}); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		used := int64(st.Blocks-st.Bfree)*st.Bsize + int64(st.Files-st.Ffree-1)*InodeCharge
		if got := Charge(s.files, page); got != used {
			t.Errorf("%s: Charge = %d, the tmpfs holds %d (%d pages, %d inodes besides the root)", s.name, got, used, st.Blocks-st.Bfree, st.Files-st.Ffree-1)
		}
	}
}

// TestAdmit checks that Write asks Admit before it writes new content, not
// when the content is unchanged, and that a refusal leaves the previous
// content in place.
func TestAdmit(t *testing.T) {
	dir := t.TempDir()
	calls := 0
	admit := func() error { calls++; return nil }
	files := map[string]api.File{"a": {Data: []byte("1")}}
	if err := Write(t.Context(), dir, files, Options{Admit: admit}); err != nil || calls != 1 {
		t.Fatalf("first Write: %v, Admit called %d times, want 1", err, calls)
	}
	if err := Write(t.Context(), dir, files, Options{Admit: admit}); err != nil || calls != 1 {
		t.Fatalf("unchanged Write: %v, Admit called %d times in all, want 1", err, calls)
	}
	refused := errors.New("no room")
	err := Write(t.Context(), dir, map[string]api.File{"a": {Data: []byte("2")}}, Options{Admit: func() error { return refused }})
	if !errors.Is(err, refused) {
		t.Fatalf("refused Write: %v, want %v", err, refused)
	}
	got, err := Read(dir)
	if err != nil || string(got["a"].Data) != "1" {
		t.Errorf("after a refused Write the content is %q, %v; want the previous %q", got["a"].Data, err, "1")
	}
}
