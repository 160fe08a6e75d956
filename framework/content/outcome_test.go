package content_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

// timestamped returns the names of dir's entries that begin with ".." and
// are directories: the timestamped directories Write made.
func timestamped(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "..") && e.IsDir() && e.Type()&os.ModeSymlink == 0 {
			out = append(out, e.Name())
		}
	}
	return out
}

// A Write that fails after Admit while it writes the new files removes them
// and says so (ErrRolledBack): the previous content is all that is left.
func TestWriteRolledBack(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]api.File{"a": file("1")})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	err := content.Write(ctx, dir, map[string]api.File{"a": file("2"), "d/b": file("3")}, content.Options{
		Admit: func() error { cancel(); return nil }, // stops the Write once it is admitted
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, content.ErrRolledBack) || errors.Is(err, content.ErrReplaced) {
		t.Fatalf("Write cut short after Admit: %v, want context.Canceled and ErrRolledBack", err)
	}
	checkRead(t, dir, map[string]api.File{"a": file("1")})
	if got := timestamped(t, dir); len(got) != 1 {
		t.Errorf("timestamped directories after the rollback: %q, want the previous one only", got)
	}
	refused := errors.New("no room")
	err = content.Write(t.Context(), dir, map[string]api.File{"a": file("2")}, content.Options{Admit: func() error { return refused }})
	if !errors.Is(err, refused) || errors.Is(err, content.ErrRolledBack) {
		t.Errorf("Write refused by Admit: %v, want the refusal alone (nothing was written)", err)
	}
}
