package content_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

// A set beyond the bounds is refused with InvalidParams naming the bound,
// before anything is written.
func TestLimits(t *testing.T) {
	many := map[string]api.File{}
	for i := range content.DefaultMaxFiles + 1 {
		many[fmt.Sprintf("f%d", i)] = api.File{}
	}
	small := map[string]api.File{}
	for i := range 100 {
		small[fmt.Sprintf("f%02d", i)] = api.File{}
	}
	for _, tc := range []struct {
		name   string
		files  map[string]api.File
		limits content.Limits
		want   string
	}{
		{"Files", many, content.Limits{}, "more than 10000 files (10001)"},
		{"Depth", map[string]api.File{strings.Repeat("d/", 32) + "f": file("x")}, content.Limits{}, "33 levels deep, beyond the bound of 32"},
		{"DeepAndLong", map[string]api.File{strings.Repeat("a/", 3000) + "f": file("x")}, content.Limits{}, "6001 bytes long, beyond the bound of 1024"},
		{"Component", map[string]api.File{strings.Repeat("c", 256): file("x")}, content.Limits{}, "a component of 256 bytes, beyond the bound of 255"},
		{"FileOverhead", small, content.Limits{MaxBytes: 100*(content.FileOverhead+3) - 1}, "takes more than 51499 bytes"},
		{"OwnBounds", map[string]api.File{"a/b/c": file("x")}, content.Limits{MaxDepth: 2}, "3 levels deep, beyond the bound of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			err := content.Write(t.Context(), dir, tc.files, content.Options{Limits: tc.limits})
			if !errors.Is(err, api.ErrInvalidParams) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write: %v, want InvalidParams saying %q", err, tc.want)
			}
			if got := entries(t, dir); len(got) != 0 {
				t.Errorf("written before the refusal: %v", got)
			}
		})
	}
	// At the bounds, a set is written.
	dir := t.TempDir()
	write(t, dir, map[string]api.File{strings.Repeat("d/", 31) + "f": file("deep")})
	if b, err := os.ReadFile(dir + "/" + strings.Repeat("d/", 31) + "f"); err != nil || string(b) != "deep" {
		t.Fatalf("file 32 levels deep: %q %v", b, err)
	}
}

// countdown is a context that is done after n calls of Err.
type countdown struct {
	context.Context
	n atomic.Int64
}

func (c *countdown) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// Write stops between two steps once its context is done: at any step, the
// previous content stays whole and current, and nothing half-written is
// left beside it.
func TestWriteStopsWhenContextDone(t *testing.T) {
	old := map[string]api.File{"a": file("old"), "d/b": file("old")}
	next := map[string]api.File{}
	for i := range 50 {
		next[fmt.Sprintf("d%d/f%d", i%5, i)] = file("new")
	}
	for n := range int64(60) {
		dir := t.TempDir()
		write(t, dir, old)
		before := entries(t, dir)
		ctx := &countdown{Context: t.Context()}
		ctx.n.Store(n)
		err := content.Write(ctx, dir, next, noGID)
		if err == nil {
			if n < 50 {
				t.Fatalf("Write with its context done after %d checks: no error", n)
			}
			continue
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Write with its context done after %d checks: %v, want Canceled", n, err)
		}
		got, err := content.Read(dir)
		if err != nil || len(got) != 2 || string(got["a"].Data) != "old" || string(got["d/b"].Data) != "old" {
			t.Fatalf("after a Write stopped at check %d: content %v (%v), want the old set", n, got, err)
		}
		if after := entries(t, dir); strings.Join(after, " ") != strings.Join(before, " ") {
			t.Fatalf("after a Write stopped at check %d: %v, want %v", n, after, before)
		}
	}
}

// A full write of 1,000 files costs the same at depth 1 and at the depth bound
// (32): every step is linear in the names (fsync per file dominates).
func BenchmarkWriteDeep(b *testing.B) {
	for _, depth := range []int{1, content.DefaultMaxDepth} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			set := map[string]api.File{}
			for i := range 1000 {
				set[strings.Repeat("d/", depth-1)+fmt.Sprintf("f%d", i)] = file("x")
			}
			dir := b.TempDir()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				set["v"] = file(fmt.Sprint(i)) // a new set each time: a full write
				i++
				if err := content.Write(b.Context(), dir, set, noGID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
