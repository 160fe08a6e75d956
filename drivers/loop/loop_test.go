package loop

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
)

func mustNew(t testing.TB, opts Options) *Backend {
	t.Helper()
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestNew(t *testing.T) {
	for _, o := range []Options{
		{},
		{Dir: "rel/loop"},
		{Dir: "/x", DefaultFSType: "btrfs"},
		{Dir: "/x", DefaultSize: -1},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) = nil error", o)
		}
	}
	b := mustNew(t, Options{Dir: "/x/"})
	if b.opts.Dir != "/x" || b.opts.DefaultFSType != FSExt4 || b.opts.DefaultMode != 0o777 {
		t.Errorf("defaults: %+v", b.opts)
	}
}

func TestValidate(t *testing.T) {
	gid := int64(3000)
	tests := []struct {
		name     string
		opts     Options
		fsType   string
		size     int64
		fsGroup  *int64
		params   api.Params
		wantErr  string // substring; "" means success
		wantFS   string
		wantSize int64
	}{
		{name: "default ext4", size: 64 << 20, wantFS: FSExt4, wantSize: 64 << 20},
		{name: "rounded up", size: 64<<20 + 1, wantFS: FSExt4, wantSize: 64<<20 + 4096},
		{name: "attribute xfs", size: 300 << 20, params: api.Params{"fsType": "xfs"}, wantFS: FSXFS, wantSize: 300 << 20},
		{name: "pod fsType xfs", size: 300 << 20, fsType: "xfs", wantFS: FSXFS, wantSize: 300 << 20},
		{name: "both agree", size: 1 << 20, fsType: "ext4", params: api.Params{"fsType": "ext4"}, wantFS: FSExt4, wantSize: 1 << 20},
		{name: "default fs xfs", opts: Options{DefaultFSType: FSXFS}, size: 1 << 30, wantFS: FSXFS, wantSize: 1 << 30},
		{name: "default size", opts: Options{DefaultSize: 100 << 20}, wantFS: FSExt4, wantSize: 100 << 20},
		{name: "owner", size: 1 << 20, params: api.Params{"mode": "0750", "uid": "1000", "gid": "2000"}, wantFS: FSExt4, wantSize: 1 << 20},
		{name: "xfs setgid", size: 300 << 20, params: api.Params{"fsType": "xfs", "mode": "2770"}, wantFS: FSXFS, wantSize: 300 << 20},
		{name: "fsGroup", size: 1 << 20, fsGroup: &gid, wantFS: FSExt4, wantSize: 1 << 20},

		{name: "bad fsType attribute", size: 1 << 20, params: api.Params{"fsType": "btrfs"}, wantErr: `"fsType"`},
		{name: "bad pod fsType", size: 1 << 20, fsType: "vfat", wantErr: `fsType "vfat" is not supported`},
		{name: "fsType mismatch", size: 300 << 20, fsType: "ext4", params: api.Params{"fsType": "xfs"}, wantErr: "set one of them"},
		{name: "xfs too small", size: 300<<20 - 4096, params: api.Params{"fsType": "xfs"}, wantErr: "minimum of 300Mi for xfs"},
		{name: "ext4 too small", size: 512 << 10, wantErr: "minimum of 1Mi for ext4"},
		{name: "missing size", wantErr: `"size" is required`},
		{name: "over max", opts: Options{MaxSize: 1 << 30}, size: 1<<30 + 1, wantErr: "maximum of 1Gi"},
		// The largest aligned size validates again (Validate is idempotent).
		{name: "largest", size: 1<<63 - 4096, wantFS: FSExt4, wantSize: 1<<63 - 4096},
		{name: "largest rounded up", size: 1<<63 - 8191, wantFS: FSExt4, wantSize: 1<<63 - 4096},
		{name: "too large to round", size: 1<<63 - 4095, wantErr: "too large"},
		{name: "max int64", size: math.MaxInt64, wantErr: "too large"},
		{name: "negative", size: -1, wantErr: "negative"},
		{name: "min int64", size: math.MinInt64, wantErr: "negative"},
		{name: "unknown attribute", size: 1 << 20, params: api.Params{"nr_inodes": "5"}, wantErr: `unknown attribute(s) "nr_inodes"`},
		{name: "bad mode", size: 1 << 20, params: api.Params{"mode": "999"}, wantErr: `"mode"`},
		{name: "bad uid", size: 1 << 20, params: api.Params{"uid": "-1"}, wantErr: `"uid"`},
		{name: "xfs sticky", size: 300 << 20, params: api.Params{"fsType": "xfs", "mode": "1777"}, wantErr: "sticky"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Dir = "/var/lib/ephemera/loop"
			b := mustNew(t, tt.opts)
			v := &api.Volume{ID: "csi-1", FSType: tt.fsType, Size: tt.size, FSGroup: tt.fsGroup, Params: tt.params}
			err := framework.ValidateVolume(b, v)
			if tt.wantErr != "" {
				if !errors.Is(err, api.ErrInvalidParams) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Validate() = %v, want ErrInvalidParams containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			if v.FSType != tt.wantFS || v.Size != tt.wantSize {
				t.Errorf("FSType, Size = %q, %d; want %q, %d", v.FSType, v.Size, tt.wantFS, tt.wantSize)
			}
			// Validate is idempotent: the framework may validate a persisted volume again.
			if err := b.Validate(v); err != nil || v.FSType != tt.wantFS || v.Size != tt.wantSize {
				t.Errorf("second Validate() = %v (%q, %d)", err, v.FSType, v.Size)
			}
		})
	}
}

func TestRoot(t *testing.T) {
	b := mustNew(t, Options{Dir: "/x"})
	gid := int64(3000)
	for _, tt := range []struct {
		params  api.Params
		fsGroup *int64
		want    rootAttrs
	}{
		{nil, nil, rootAttrs{mode: 0o777}},
		{api.Params{"uid": "1000"}, nil, rootAttrs{mode: 0o777, uid: 1000}},
		{nil, &gid, rootAttrs{mode: fs.ModeSetgid | 0o775, gid: 3000}},
		{api.Params{"gid": "5"}, &gid, rootAttrs{mode: 0o777, gid: 5}},
		{api.Params{"mode": "0700"}, &gid, rootAttrs{mode: 0o700, gid: 3000}},
	} {
		v := &api.Volume{Params: tt.params, FSGroup: tt.fsGroup}
		if err := b.Attributes().Apply(v); err != nil { // as the framework and Validate do
			t.Fatal(err)
		}
		got, err := b.root(v, FSExt4)
		if err != nil || got != tt.want {
			t.Errorf("root(%v, fsGroup %v) = %+v, %v; want %+v", tt.params, tt.fsGroup, got, err, tt.want)
		}
	}
}

func TestMkfsArgs(t *testing.T) {
	r := rootAttrs{mode: fs.ModeSetgid | fs.ModeSticky | 0o770, uid: 1000, gid: 2000}
	got := mkfsArgs(FSExt4, "/dev/loop3", "", r)
	want := []string{"-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=1000:2000", "/dev/loop3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ext4 args = %q", got)
	}
	if got := debugfsArgs("/dev/loop3", r); !reflect.DeepEqual(got, []string{"-w", "-R", "set_inode_field / mode 043770", "/dev/loop3"}) {
		t.Errorf("debugfs args = %q", got)
	}
	if got := debugfsArgs("/dev/loop3", rootAttrs{mode: 0o755}); got != nil {
		t.Errorf("debugfs args for 0755 = %q, want none", got)
	}
	if got := mkfsArgs(FSXFS, "/dev/loop3", "/d/p", r); !reflect.DeepEqual(got, []string{"-q", "-f", "-K", "-p", "/d/p", "/dev/loop3"}) {
		t.Errorf("xfs args = %q", got)
	}
	if got, want := xfsProto(rootAttrs{mode: fs.ModeSetgid | 0o770, uid: 1000, gid: 2000}), "ephemera\n0 0\nd-g770 1000 2000\n$\n"; got != want {
		t.Errorf("xfsProto = %q, want %q", got, want)
	}
	if got, want := xfsProto(rootAttrs{mode: 0o7}), "ephemera\n0 0\nd--007 0 0\n$\n"; got != want {
		t.Errorf("xfsProto = %q, want %q", got, want)
	}
}

func TestDetectFS(t *testing.T) {
	blank := make([]byte, superblockProbe)
	if got := detectFS(blank); got != "" {
		t.Errorf("blank: %q", got)
	}
	ext := make([]byte, superblockProbe)
	binary.LittleEndian.PutUint16(ext[1080:], 0xEF53)
	if got := detectFS(ext); got != FSExt4 {
		t.Errorf("ext4: %q", got)
	}
	xfs := make([]byte, superblockProbe)
	copy(xfs, "XFSB")
	if got := detectFS(xfs); got != FSXFS {
		t.Errorf("xfs: %q", got)
	}
	xfs[xfsInProgressOffset] = 1
	if got := detectFS(xfs); got != "" {
		t.Errorf("xfs in progress: %q", got)
	}
	if got := detectFS([]byte("XF")); got != "" {
		t.Errorf("short: %q", got)
	}
}

func TestParseBackingFile(t *testing.T) {
	for in, want := range map[string]struct {
		path    string
		deleted bool
	}{
		"/var/lib/x/csi-1.img\n":           {"/var/lib/x/csi-1.img", false},
		"/var/lib/x/csi-1.img (deleted)\n": {"/var/lib/x/csi-1.img", true},
		"/a b/c.img":                       {"/a b/c.img", false},
	} {
		p, d := parseBackingFile(in)
		if p != want.path || d != want.deleted {
			t.Errorf("parseBackingFile(%q) = %q, %v", in, p, d)
		}
	}
}

func TestNames(t *testing.T) {
	for name, want := range map[string]bool{"loop0": true, "loop12": true, "loop": false, "loop-control": false, "loop1p1": false, "sda": false} {
		if got := isLoopName(name); got != want {
			t.Errorf("isLoopName(%q) = %v", name, got)
		}
	}
	for path, want := range map[string]string{
		"/d/csi-1.img":     "csi-1",
		"/d/sub/csi-1.img": "",
		"/e/csi-1.img":     "",
		"/d/csi-1.raw":     "",
		"/d/.img":          "",
		"/d/.proto-1.img":  "",
	} {
		if got := volumeIDOf("/d", path); got != want {
			t.Errorf("volumeIDOf(%q) = %q, want %q", path, got, want)
		}
	}
	for _, id := range []string{"", ".", "..", "a/b", `a\b`, ".hidden"} {
		if validID(id) == nil {
			t.Errorf("validID(%q) = nil", id)
		}
	}
	if got := sortedIDs(map[string]bool{"b": true, "a": true}); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("sortedIDs = %v", got)
	}
}

func TestHumanAndRound(t *testing.T) {
	for n, want := range map[int64]string{1 << 20: "1Mi", 300 << 20: "300Mi", 3 << 30: "3Gi", 4096: "4Ki", 1000: "1000 bytes"} {
		if got := human(n); got != want {
			t.Errorf("human(%d) = %q, want %q", n, got, want)
		}
	}
	for in, want := range map[int64]int64{1: 4096, 4096: 4096, 4097: 8192} {
		if got := roundUp(in); got != want {
			t.Errorf("roundUp(%d) = %d", in, got)
		}
	}
	long := "/var/lib/ephemera/scratch.csi.ephemera.dev/loop/csi-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.img"
	if got := loFileName(long); len(got) != 63 || !strings.HasSuffix(long, string(got)) {
		t.Errorf("loFileName = %q", got)
	}
	if got := loFileName("/d/x.img"); string(got) != "/d/x.img" {
		t.Errorf("loFileName short = %q", got)
	}
}
