package stamp

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "area")
	if id, err := Read(dir); id != "" || err != nil {
		t.Fatalf("Read(missing dir) = %q, %v", id, err)
	}
	if err := Write(dir, "abc"); err != nil {
		t.Fatal(err)
	}
	if id, err := Read(dir); id != "abc" || err != nil {
		t.Fatalf("Read = %q, %v", id, err)
	}
	if err := Write(dir, "def"); err != nil {
		t.Fatal(err)
	}
	if id, err := Read(dir); id != "def" || err != nil {
		t.Fatalf("Read after rewrite = %q, %v", id, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	for _, bad := range []string{"", "a\nb", string(make([]byte, 300))} {
		if err := Write(dir, bad); err == nil {
			t.Errorf("Write(%q) accepted", bad)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("x\ny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err == nil {
		t.Error("a malformed stamp was accepted")
	}
}
