package content_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

// rootWriter is an Options.WriteFiles of the tests: it writes what it is
// given beneath dir as the framework's writer does, and records it.
type rootWriter struct {
	calls []map[string]api.File
	gids  []int
	err   error // returned after writing the first file, when set
}

func (w *rootWriter) write(_ context.Context, dir *os.File, files map[string]api.File, gid int) error {
	w.calls = append(w.calls, files)
	w.gids = append(w.gids, gid)
	r, err := os.OpenRoot(dir.Name())
	if err != nil {
		return err
	}
	defer r.Close()
	for name, f := range files {
		if err := r.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		if err := r.WriteFile(name, f.Data, f.Mode); err != nil {
			return err
		}
		if w.err != nil {
			return w.err
		}
	}
	return nil
}

// With Options.WriteFiles the new files are written by it, named below a
// fresh timestamped directory with their final modes, and Write swaps them
// in as its own; a Write whose files are the content already does not
// call it; a writer's failure leaves the previous content, and one that
// says the volume is full is ErrNoSpace.
func TestWriteFiles(t *testing.T) {
	dir := t.TempDir()
	w := &rootWriter{}
	opts := content.Options{WriteFiles: w.write}
	files := map[string]api.File{"a": {Data: []byte("1")}, "d/b": {Data: []byte("2"), Mode: 0o600}}
	if err := content.Write(t.Context(), dir, files, opts); err != nil {
		t.Fatal(err)
	}
	ts, err := content.Current(dir)
	if err != nil || len(w.calls) != 1 || w.gids[0] != -1 {
		t.Fatalf("Current = %q, %v after %d writer calls (gids %v)", ts, err, len(w.calls), w.gids)
	}
	for name, want := range map[string]fs.FileMode{"a": 0o644, "d/b": 0o600} {
		f, ok := w.calls[0][ts+"/"+name]
		if !ok || f.Mode != want || !bytes.Equal(f.Data, files[name].Data) {
			t.Errorf("the writer was given %q as %+v (present %v), want mode %v", ts+"/"+name, f, ok, want)
		}
	}
	checkRead(t, dir, files)
	if err := content.Write(t.Context(), dir, files, opts); err != nil || len(w.calls) != 1 {
		t.Fatalf("the same content again: %v, %d writer calls, want none more", err, len(w.calls))
	}

	for _, tc := range []struct {
		err  error
		want error
	}{
		{errors.New("writer died"), content.ErrRolledBack},
		{fmt.Errorf("pod: %w", content.ErrNoSpace), content.ErrNoSpace},
	} {
		w.err = tc.err
		err := content.Write(t.Context(), dir, map[string]api.File{"a": {Data: []byte("new")}}, opts)
		if !errors.Is(err, tc.want) || !errors.Is(err, content.ErrRolledBack) {
			t.Errorf("a writer failing with %v: %v, want %v, rolled back", tc.err, err, tc.want)
		}
		checkRead(t, dir, files)
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if n := strings.Count(strings.Join(names, " "), ".."); n != 2 { // ..data and one timestamped directory
			t.Errorf("after a failed writer the volume holds %v", names)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "..data", "d", "b")); err != nil {
		t.Error(err)
	}
}
