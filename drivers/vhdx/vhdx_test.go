package vhdx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/backendtest"
	"github.com/ephemera-csi/ephemera/framework/stamp"
)

const id = "csi-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func newTest(t *testing.T, mutate func(*Options)) (*Backend, *fakeHost, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "vhdx")
	f := newFakeHost()
	opts := Options{Dir: dir, host: f}
	if mutate != nil {
		mutate(&opts)
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b, f, dir
}

func vol(size int64) *api.Volume { return &api.Volume{ID: id, Size: size} }

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		ok   bool
	}{
		{Options{Dir: "/var/lib/ephemera/vhdx"}, true},
		{Options{Dir: `C:\var\lib\ephemera\vhdx`}, true},
		{Options{Dir: `c:/var/lib/ephemera/vhdx`}, true},
		{Options{Dir: ""}, false},
		{Options{Dir: `var\lib`}, false},
		{Options{Dir: `C:var`}, false},
		{Options{Dir: "/x", DefaultSize: -1}, false},
		{Options{Dir: "/x", MaxSize: 1 << 20}, false},
		{Options{Dir: "/x", MaxSize: 1 << 30}, true},
	} {
		tc.opts.host = newFakeHost()
		if _, err := New(tc.opts); (err == nil) != tc.ok {
			t.Errorf("New(%+v): %v, want ok %v", tc.opts, err, tc.ok)
		}
	}
}

func TestValidate(t *testing.T) {
	b, _, _ := newTest(t, func(o *Options) { o.MaxSize = 10 << 30 })
	withDefault, _, _ := newTest(t, func(o *Options) { o.DefaultSize = 256 << 20 })
	for _, tc := range []struct {
		name     string
		b        *Backend
		size     int64
		fsType   string
		params   api.Params
		wantSize int64
		wantErr  string
	}{
		{"size required", b, 0, "", nil, 0, "required"},
		{"default size", withDefault, 0, "", nil, 256 << 20, ""},
		{"exact", b, 1 << 30, "", nil, 1 << 30, ""},
		{"rounded up to 1Mi", b, 100<<20 + 1, "", nil, 101 << 20, ""},
		{"below minimum", b, 63 << 20, "", nil, 0, "below the minimum of 64Mi"},
		{"minimum", b, 64 << 20, "", nil, 64 << 20, ""},
		{"above maximum", b, 11 << 30, "", nil, 0, "exceeds the vhdx backend's maximum of 10Gi"},
		{"maximum", b, 10 << 30, "", nil, 10 << 30, ""},
		{"overflow", b, 1<<63 - 1, "", nil, 0, "out of range"},
		{"largest before rounding", b, 1<<63 - 1 - 1<<20, "", nil, 0, "exceeds the vhdx backend's maximum"},
		{"negative", b, -1, "", nil, 0, "out of range"},
		{"min int64", b, -1 << 63, "", nil, 0, "out of range"},
		{"pod fsType ntfs", b, 1 << 30, "ntfs", nil, 1 << 30, ""},
		{"pod fsType NTFS", b, 1 << 30, "NTFS", nil, 1 << 30, ""},
		{"pod fsType ext4", b, 1 << 30, "ext4", nil, 0, `fsType "ext4" is not supported`},
		{"attribute fsType ntfs", b, 1 << 30, "", api.Params{"fsType": "ntfs"}, 1 << 30, ""},
		{"attribute fsType refs", b, 1 << 30, "", api.Params{"fsType": "refs"}, 0, `fsType "refs"`},
		{"unknown attribute", b, 1 << 30, "", api.Params{"mode": "0777"}, 0, "mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &api.Volume{ID: id, Size: tc.size, FSType: tc.fsType, Params: tc.params}
			err := framework.ValidateVolume(tc.b, v)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, api.ErrInvalidParams) {
					t.Fatalf("err = %v, want InvalidParams containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Size != tc.wantSize || v.FSType != FSNTFS {
				t.Errorf("size %d fsType %q, want %d ntfs", v.Size, v.FSType, tc.wantSize)
			}
		})
	}
}

func TestPaths(t *testing.T) {
	b, err := New(Options{Dir: `C:\var\lib\ephemera\vhdx\`, host: newFakeHost()})
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.paths(id)
	if err != nil {
		t.Fatal(err)
	}
	want := paths{
		file: `C:\var\lib\ephemera\vhdx\` + id + `.vhdx`,
		tmp:  `C:\var\lib\ephemera\vhdx\` + id + `.vhdx.tmp`,
		mnt:  `C:\var\lib\ephemera\vhdx\mnt\` + id,
	}
	if p != want {
		t.Errorf("paths = %+v, want %+v", p, want)
	}
	if len(p.mnt) > 260 {
		t.Errorf("mount folder path longer than MAX_PATH: %d", len(p.mnt))
	}
	for _, bad := range []string{"", ".", "..", `a\b`, "a/b", "c:x", "x.", "x ", strings.Repeat("a", 129), `a*`} {
		if _, err := b.paths(bad); err == nil {
			t.Errorf("paths(%q) accepted", bad)
		}
	}
}

func TestCreateFresh(t *testing.T) {
	b, f, dir := newTest(t, nil)
	src, err := b.Create(t.Context(), vol(1<<30))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "mnt", id); src.Path != want || !src.IsDir() {
		t.Errorf("source %+v, want a directory %s", src, want)
	}
	want := []string{"CreateVHDX", "Rename", "Attach", "PrepareDisk", "Format", "Mount"}
	if got := f.ops(); !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	if !slices.Contains(f.calls, "CreateVHDX "+id+".vhdx.tmp 1073741824 false") {
		t.Errorf("not a fixed-size VHDX of the volume's size created under its temporary name: %v", f.calls)
	}
	if err := b.Check(t.Context(), vol(1<<30)); err != nil {
		t.Errorf("Check: %v", err)
	}
	// Again: nothing to do.
	f.reset()
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	if got := f.ops(); !slices.Equal(got, []string{"PrepareDisk"}) { // idempotent: checks, then nothing to do
		t.Errorf("second Create changed something: %v", got)
	}
}

func TestCreateDynamic(t *testing.T) {
	b, f, _ := newTest(t, func(o *Options) { o.Dynamic = true })
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(f.calls, "CreateVHDX "+id+".vhdx.tmp 1073741824 true") {
		t.Errorf("no dynamic VHDX: %v", f.calls)
	}
}

// A Create that fails at any step is finished by the next one, which never
// formats twice and ends in the same state as an uninterrupted Create. Delete
// from the interrupted state leaves nothing either.
func TestCreateInterrupted(t *testing.T) {
	for _, op := range []string{"CreateVHDX", "Rename", "Attach", "PrepareDisk", "Format", "Mount"} {
		t.Run(op, func(t *testing.T) {
			b, f, _ := newTest(t, nil)
			f.fail[op] = errInjected
			if _, err := b.Create(t.Context(), vol(1<<30)); !errors.Is(err, errInjected) {
				t.Fatalf("Create: %v, want the injected error", err)
			}
			f.reset()
			if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if err := b.Check(t.Context(), vol(1<<30)); err != nil {
				t.Errorf("Check after retry: %v", err)
			}
			for _, done := range []string{"CreateVHDX", "Rename", "Attach", "Format", "Mount"} {
				before := slices.Index([]string{"CreateVHDX", "Rename", "Attach", "PrepareDisk", "Format", "Mount"}, done) <
					slices.Index([]string{"CreateVHDX", "Rename", "Attach", "PrepareDisk", "Format", "Mount"}, op)
				if done == "CreateVHDX" && op == "Rename" {
					continue // an unrenamed file may be incomplete: made afresh
				}
				if before && slices.Contains(f.ops(), done) {
					t.Errorf("retry repeated %s, which had succeeded: %v", done, f.ops())
				}
			}

			// And from the interrupted state straight to Delete.
			b2, f2, dir2 := newTest(t, nil)
			f2.fail[op] = errInjected
			if _, err := b2.Create(t.Context(), vol(1<<30)); err == nil {
				t.Fatal("no error")
			}
			if err := b2.Delete(t.Context(), vol(0)); err != nil {
				t.Fatalf("Delete after interrupted Create: %v", err)
			}
			if left := f2.leftovers(dir2); left != "" {
				t.Errorf("left after Delete: %s", left)
			}
		})
	}
}

// performedBefore returns the prefix of ops (the changing operations of an
// uninterrupted call) that the steps before the n-th (1-based) performed.
func performedBefore(steps, ops []string, n int) []string {
	i := 0
	for _, s := range steps[:n-1] {
		if i < len(ops) && ops[i] == s {
			i++
		}
	}
	return ops[:i]
}

// A Create whose context ends before any of its steps returns the context's
// error without starting that step (except the rename of a complete file,
// which is never thrown away), and leaves a state that the next Create
// finishes without redoing what was done, or that Delete removes.
func TestCreateCancelled(t *testing.T) {
	b, f, _ := newTest(t, nil)
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	steps, ops := f.stepsTaken(), f.ops()
	if want := []string{"CreateVHDX", "Rename", "Attach", "PrepareDisk", "Format", "Mount"}; !slices.Equal(ops, want) {
		t.Fatalf("calls %v, want %v", ops, want)
	}
	for n := 1; n <= len(steps); n++ {
		t.Run(fmt.Sprintf("%d %s", n, steps[n-1]), func(t *testing.T) {
			b, f, _ := newTest(t, nil)
			ctx, cancel := context.WithCancel(t.Context())
			f.cancelAtStep(n, cancel)
			_, err := b.Create(ctx, vol(1<<30))
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Create = %v, want an error wrapping context.Canceled", err)
			}
			want := performedBefore(steps, ops, n)
			if steps[n-1] == "Rename" {
				want = append(slices.Clone(want), "Rename")
			}
			first := f.ops()
			if !slices.Equal(first, want) {
				t.Errorf("cancelled Create did %v, want %v (nothing from step %d on)", first, want, n)
			}
			f.reset()
			if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
				t.Fatalf("Create after the cancelled one: %v", err)
			}
			if err := b.Check(t.Context(), vol(1<<30)); err != nil {
				t.Errorf("Check: %v", err)
			}
			all := slices.Concat(first, f.ops())
			for _, op := range []string{"CreateVHDX", "Rename", "Attach", "Format", "Mount"} {
				if c := count(all, op); c != 1 {
					t.Errorf("%s done %d times over both Creates, want once: %v then %v", op, c, first, f.ops())
				}
			}

			// And from the cancelled state straight to Delete.
			b2, f2, dir2 := newTest(t, nil)
			ctx2, cancel2 := context.WithCancel(t.Context())
			f2.cancelAtStep(n, cancel2)
			if _, err := b2.Create(ctx2, vol(1<<30)); !errors.Is(err, context.Canceled) {
				t.Fatalf("Create = %v, want context.Canceled", err)
			}
			if err := b2.Delete(t.Context(), vol(0)); err != nil {
				t.Fatalf("Delete after a cancelled Create: %v", err)
			}
			if left := f2.leftovers(dir2); left != "" {
				t.Errorf("left after Delete: %s", left)
			}
		})
	}
}

func count(s []string, v string) (n int) {
	for _, e := range s {
		if e == v {
			n++
		}
	}
	return n
}

// A deadline that has passed stops Create before it touches the node, with an
// error the framework maps to DeadlineExceeded.
func TestCreateDeadline(t *testing.T) {
	b, f, dir := newTest(t, nil)
	ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := b.Create(ctx, vol(1<<30)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Create = %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if got := f.stepsTaken(); len(got) != 1 {
		t.Errorf("Create went on after the first refused step: %v", got)
	}
	if left := f.leftovers(dir); left != "" {
		t.Errorf("left: %s", left)
	}
}

// After a node reboot the disk is detached and the folder is no longer a mount
// point: Create re-attaches and re-mounts and keeps the data (no format).
func TestCreateAfterReboot(t *testing.T) {
	b, f, _ := newTest(t, nil)
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	for _, d := range f.files {
		d.data = "pod data"
	}
	f.reboot()
	if err := b.Check(t.Context(), vol(1<<30)); err == nil || !strings.Contains(err.Error(), "not attached") {
		t.Errorf("Check after reboot: %v, want not attached", err)
	}
	f.reset()
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	if got, want := f.ops(), []string{"Attach", "PrepareDisk", "Mount"}; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	for _, d := range f.files {
		if d.data != "pod data" {
			t.Errorf("data lost: %q", d.data)
		}
	}
}

func TestCreateFolderHoldsAnotherVolume(t *testing.T) {
	b, f, dir := newTest(t, nil)
	f.mounts[filepath.Join(dir, "mnt", id)] = `\\?\Volume{deadbeef-0000-0000-0000-000000000000}\`
	_, err := b.Create(t.Context(), vol(1<<30))
	if err == nil || !strings.Contains(err.Error(), "mountvol") {
		t.Fatalf("Create: %v, want an error naming the foreign volume", err)
	}
}

func TestDelete(t *testing.T) {
	b, f, dir := newTest(t, nil)
	if err := b.Delete(t.Context(), vol(0)); err != nil {
		t.Fatalf("Delete of nothing: %v", err)
	}
	if got := f.ops(); len(got) != 0 {
		t.Errorf("Delete of nothing did something: %v", got)
	}
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	f.reset()
	if err := b.Delete(t.Context(), vol(0)); err != nil {
		t.Fatal(err)
	}
	if got, want := f.ops(), []string{"Unmount", "Detach", "RemoveFile", "RemoveDir"}; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	if left := f.leftovers(dir); left != "" {
		t.Errorf("left: %s", left)
	}
	if err := b.Delete(t.Context(), vol(0)); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

func TestDeleteInterrupted(t *testing.T) {
	for _, op := range []string{"Unmount", "Detach", "RemoveFile", "RemoveDir"} {
		t.Run(op, func(t *testing.T) {
			b, f, dir := newTest(t, nil)
			if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
				t.Fatal(err)
			}
			f.fail[op] = errInjected
			if err := b.Delete(t.Context(), vol(0)); !errors.Is(err, errInjected) {
				t.Fatalf("Delete: %v, want the injected error", err)
			}
			if err := b.Delete(t.Context(), vol(0)); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if left := f.leftovers(dir); left != "" {
				t.Errorf("left: %s", left)
			}
		})
	}
}

// A Delete whose context ends before any of its steps returns the context's
// error without starting that step, and the next Delete removes what is left.
func TestDeleteCancelled(t *testing.T) {
	b, f, _ := newTest(t, nil)
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	f.reset()
	if err := b.Delete(t.Context(), vol(0)); err != nil {
		t.Fatal(err)
	}
	steps, ops := f.stepsTaken(), f.ops()
	for n := 1; n <= len(steps); n++ {
		t.Run(fmt.Sprintf("%d %s", n, steps[n-1]), func(t *testing.T) {
			b, f, dir := newTest(t, nil)
			if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
				t.Fatal(err)
			}
			f.reset()
			ctx, cancel := context.WithCancel(t.Context())
			f.cancelAtStep(n, cancel)
			if err := b.Delete(ctx, vol(0)); !errors.Is(err, context.Canceled) {
				t.Fatalf("Delete = %v, want an error wrapping context.Canceled", err)
			}
			if got, want := f.ops(), performedBefore(steps, ops, n); !slices.Equal(got, want) {
				t.Errorf("cancelled Delete did %v, want %v (nothing from step %d on)", got, want, n)
			}
			if err := b.Delete(t.Context(), vol(0)); err != nil {
				t.Fatalf("Delete after the cancelled one: %v", err)
			}
			if left := f.leftovers(dir); left != "" {
				t.Errorf("left: %s", left)
			}
		})
	}
}

func TestDeleteAfterReboot(t *testing.T) {
	b, f, dir := newTest(t, nil)
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	f.reboot()
	f.reset()
	if err := b.Delete(t.Context(), vol(0)); err != nil {
		t.Fatal(err)
	}
	if got, want := f.ops(), []string{"RemoveFile", "RemoveDir"}; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	if left := f.leftovers(dir); left != "" {
		t.Errorf("left: %s", left)
	}
}

func TestListAndCheck(t *testing.T) {
	b, f, dir := newTest(t, nil)
	ctx := t.Context()
	other := "csi-" + strings.Repeat("1", 64)
	creating := "csi-" + strings.Repeat("2", 64)
	for _, v := range []string{id, other} {
		if _, err := b.Create(ctx, &api.Volume{ID: v, Size: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	f.fail["Rename"] = errInjected
	if _, err := b.Create(ctx, &api.Volume{ID: creating, Size: 1 << 30}); err == nil {
		t.Fatal("no error")
	}
	if err := f.MkdirAll(ctx, filepath.Join(dir, "unrelated.txt.d")); err != nil {
		t.Fatal(err)
	}
	ids, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{id, other, creating}; !slices.Equal(ids, slices.Sorted(slices.Values(want))) {
		t.Errorf("List = %v, want %v", ids, want)
	}
	// Check: healthy, then unmounted, then the file gone.
	if err := b.Check(ctx, vol(0)); err != nil {
		t.Errorf("Check: %v", err)
	}
	delete(f.mounts, filepath.Join(dir, "mnt", id))
	if err := b.Check(ctx, vol(0)); err == nil || !strings.Contains(err.Error(), "not mounted") {
		t.Errorf("Check of an unmounted volume: %v", err)
	}
	if err := b.Check(ctx, &api.Volume{ID: creating}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Check of a volume without its file: %v", err)
	}
}

// List and Check pass their context down: a cancelled one stops them.
func TestListAndCheckCancelled(t *testing.T) {
	b, _, _ := newTest(t, nil)
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if ids, err := b.List(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("List = %v, %v; want an error wrapping context.Canceled", ids, err)
	}
	if err := b.Check(ctx, vol(0)); !errors.Is(err, context.Canceled) {
		t.Errorf("Check = %v, want an error wrapping context.Canceled", err)
	}
}

// The storage stamp is kept in Dir through the host, survives a new backend
// on the same Dir, is not a volume for List and is not written once the
// context has ended.
func TestStamp(t *testing.T) {
	b, f, dir := newTest(t, nil)
	if st, err := b.Stamp(t.Context()); st != "" || err != nil {
		t.Fatalf("Stamp of a new Dir = %q, %v; want none", st, err)
	}
	if err := b.SetStamp(t.Context(), "store-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, stamp.FileName)); err != nil {
		t.Errorf("no stamp file in Dir: %v", err)
	}
	again, err := New(Options{Dir: dir, host: f})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := again.Stamp(t.Context()); st != "store-1" || err != nil {
		t.Errorf("Stamp = %q, %v; want store-1", st, err)
	}
	if _, err := b.Create(t.Context(), vol(1<<30)); err != nil {
		t.Fatal(err)
	}
	if ids, err := b.List(t.Context()); err != nil || !slices.Equal(ids, []string{id}) {
		t.Errorf("List = %v, %v; want only %s", ids, err, id)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.SetStamp(ctx, "store-2"); !errors.Is(err, context.Canceled) {
		t.Errorf("SetStamp with a cancelled context = %v, want context.Canceled", err)
	}
	if _, err := b.Stamp(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Stamp with a cancelled context = %v, want context.Canceled", err)
	}
	if st, err := b.Stamp(t.Context()); st != "store-1" || err != nil {
		t.Errorf("Stamp after a cancelled SetStamp = %q, %v; want store-1", st, err)
	}
	f.fail["WriteStamp"] = errInjected
	if err := b.SetStamp(t.Context(), "store-2"); !errors.Is(err, errInjected) {
		t.Errorf("SetStamp = %v, want the injected error", err)
	}
	if err := b.SetStamp(t.Context(), "store-2"); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Stamp(t.Context()); st != "store-2" || err != nil {
		t.Errorf("Stamp = %q, %v; want store-2", st, err)
	}
}

func TestParseDiskNumber(t *testing.T) {
	for in, want := range map[string]int64{
		`\\.\PhysicalDrive0`:    0,
		`\\.\PhysicalDrive17`:   17,
		`\\.\PHYSICALDRIVE3`:    3,
		`\\.\PhysicalDrive`:     -1,
		`\\.\PhysicalDrive-1`:   -1,
		`\\.\PhysicalDrive1x`:   -1,
		`\\?\Volume{x}`:         -1,
		``:                      -1,
		`\\.\PhysicalDrive9999`: 9999,
	} {
		got, err := parseDiskNumber(in)
		if want < 0 {
			if err == nil {
				t.Errorf("parseDiskNumber(%q) = %d, want an error", in, got)
			}
			continue
		}
		if err != nil || int64(got) != want {
			t.Errorf("parseDiskNumber(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestSameVolume(t *testing.T) {
	const g = "Volume{452e318a-5cde-421e-9831-b9853c521012}"
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{`\\?\` + g + `\`, g, true},
		{`\\?\` + g + `\`, `\\?\` + strings.ToUpper(g) + `\`, true},
		{g, "Volume{00000000-5cde-421e-9831-b9853c521012}", false},
		{"", "", false},
		{"C:\\", "C:\\", false},
		{"Volume{unterminated", "Volume{unterminated", false},
	} {
		if got := sameVolume(tc.a, tc.b); got != tc.same {
			t.Errorf("sameVolume(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}

// The framework's backend contract, with the fake node.
func TestBackendConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend {
		b, err := New(Options{Dir: filepath.Join(t.TempDir(), "vhdx"), host: newFakeHost()})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}, backendtest.Options{Params: map[string]string{"size": "64Mi"}})
}
