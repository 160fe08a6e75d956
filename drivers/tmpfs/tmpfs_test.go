package tmpfs_test

import (
	"errors"
	"io/fs"
	"runtime"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

func newBackend(t testing.TB, opts tmpfs.Options) *tmpfs.Backend {
	t.Helper()
	b, err := tmpfs.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// New refuses negative sizes and inode limits and mode bits tmpfs' mode= has
// no place for, naming the field; zero takes the default.
func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		name    string
		opts    tmpfs.Options
		wantErr []string // "" for none
	}{
		{name: "zero", opts: tmpfs.Options{}},
		{name: "all set", opts: tmpfs.Options{DefaultSize: 1 << 20, DefaultMode: 0o750 | fs.ModeSetgid | fs.ModeSticky | fs.ModeSetuid,
			BytesPerInode: 1, MinInodes: 1, MaxInodes: 1}},
		{name: "negative DefaultSize", opts: tmpfs.Options{DefaultSize: -1}, wantErr: []string{"DefaultSize -1 must not be negative"}},
		{name: "negative BytesPerInode", opts: tmpfs.Options{BytesPerInode: -4096}, wantErr: []string{"BytesPerInode -4096"}},
		{name: "negative MinInodes", opts: tmpfs.Options{MinInodes: -1}, wantErr: []string{"MinInodes -1"}},
		{name: "negative MaxInodes", opts: tmpfs.Options{MaxInodes: -1}, wantErr: []string{"MaxInodes -1"}},
		{name: "octal sticky bit", opts: tmpfs.Options{DefaultMode: 0o1777}, wantErr: []string{"DefaultMode 01777 has bits 01000", "fs.ModeSticky"}},
		{name: "directory bit", opts: tmpfs.Options{DefaultMode: fs.ModeDir | 0o755}, wantErr: []string{"DefaultMode", "other than the permission"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := tmpfs.New(c.opts)
			if c.wantErr == nil {
				if err != nil || b == nil {
					t.Fatalf("New: %v, %v", b, err)
				}
				return
			}
			if err == nil || b != nil {
				t.Fatalf("New: %v, %v, want an error", b, err)
			}
			for _, s := range c.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("New: %v, want it to say %q", err, s)
				}
			}
		})
	}
}

// The inode limit: "nr_inodes" up to MaxInodes, or else size/BytesPerInode
// within [MinInodes, MaxInodes]; never 0 (unlimited to the kernel).
func TestNrInodes(t *testing.T) {
	const mi = 1 << 20
	custom := tmpfs.Options{BytesPerInode: mi, MinInodes: 10, MaxInodes: 100}
	for _, c := range []struct {
		name    string
		opts    tmpfs.Options
		size    int64
		inodes  string // the "nr_inodes" attribute; "" for none
		want    string // the nr_inodes= option
		wantErr []string
	}{
		{name: "derived 4Mi", size: 4 * mi, want: "1024"},
		{name: "derived 64Mi", size: 64 * mi, want: "16384"},
		{name: "derived 4Gi", size: 4096 * mi, want: "1048576"},
		{name: "floor", size: mi, want: "1024"},
		{name: "floor below a page", size: 4096, want: "1024"},
		{name: "cap on the derived value", size: 64 << 30, want: "1048576"},
		{name: "explicit", size: 4 * mi, inodes: "50000", want: "50000"},
		{name: "explicit below the default", size: 64 * mi, inodes: "1", want: "1"},
		{name: "explicit at the cap", size: 4 * mi, inodes: "1048576", want: "1048576"},
		{name: "over the cap", size: 4 * mi, inodes: "1048577",
			wantErr: []string{`"nr_inodes": 1048577 exceeds this driver's cap of 1048576 inodes (tmpfs.Options.MaxInodes)`, "default (1024 for this size)"}},
		{name: "2^40", size: 4 * mi, inodes: "1099511627776", wantErr: []string{"cap of 1048576 inodes", "(tmpfs.Options.MaxInodes)"}},
		{name: "zero is unlimited", size: 4 * mi, inodes: "0", wantErr: []string{"0 means no inode limit", "unbounded", "between 1 and 1048576"}},
		{name: "negative", size: 4 * mi, inodes: "-1", wantErr: []string{`"-1" is not a whole number of inodes between 1 and 1048576`}},
		{name: "kernel suffix", size: 4 * mi, inodes: "1k", wantErr: []string{`"1k" is not a whole number`}},
		{name: "beyond int64", size: 4 * mi, inodes: "99999999999999999999", wantErr: []string{"is not a whole number"}},
		{name: "empty", size: 4 * mi, inodes: " ", wantErr: []string{"is not a whole number"}},
		{name: "custom ratio", opts: custom, size: 50 * mi, want: "50"},
		{name: "custom floor", opts: custom, size: 4 * mi, want: "10"},
		{name: "custom cap", opts: custom, size: 1 << 30, want: "100"},
		{name: "custom cap refuses", opts: custom, size: mi, inodes: "101", wantErr: []string{"cap of 100 inodes"}},
		{name: "cap named by a flag", opts: tmpfs.Options{MaxInodes: 100, MaxInodesName: "--tmpfs-max-inodes"}, size: mi, inodes: "101", wantErr: []string{"cap of 100 inodes (--tmpfs-max-inodes)"}},
		{name: "cap below the floor wins", opts: tmpfs.Options{MinInodes: 5000, MaxInodes: 2000}, size: mi, want: "2000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := &api.Volume{ID: "csi-x", Size: c.size, Params: api.Params{}}
			if c.inodes != "" {
				v.Params[tmpfs.ParamNrInodes] = c.inodes
			}
			b := newBackend(t, c.opts)
			err := framework.ValidateVolume(b, v)
			if c.wantErr != nil {
				if !errors.Is(err, api.ErrInvalidParams) {
					t.Fatalf("Validate: %v, want an error wrapping ErrInvalidParams", err)
				}
				for _, s := range c.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("Validate: %v, want it to say %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if runtime.GOOS != "linux" {
				return // Create refuses tmpfs elsewhere
			}
			src, err := b.Create(t.Context(), v)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(src.Options, "nr_inodes="+c.want) {
				t.Errorf("options %q, want nr_inodes=%s", src.Options, c.want)
			}
		})
	}
}

// A pod's nr_inodes over the cap is InvalidArgument from NodePublishVolume, and
// nothing is mounted.
func TestNrInodesOverCapIsInvalidArgument(t *testing.T) {
	fake := mount.NewFake()
	h := drivertest.Start(t, framework.Options{
		Backends: map[string]framework.Backend{"tmpfs": newBackend(t, tmpfs.Options{MaxInodes: 5000})},
		Volumes:  framework.VolumeOptions{Mounter: fake},
	})
	pod := h.Kubelet.NewPod("ns", "p")
	for _, inodes := range []string{"5001", "0", "1099511627776"} {
		err := h.Kubelet.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v",
			Attributes: map[string]string{"size": "4Mi", tmpfs.ParamNrInodes: inodes}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tmpfs.ParamNrInodes) {
			t.Errorf("nr_inodes %s: %v, want InvalidArgument naming nr_inodes", inodes, err)
		}
		if inodes != "0" && !strings.Contains(err.Error(), "cap of 5000 inodes") {
			t.Errorf("nr_inodes %s: %v, want it to name the cap", inodes, err)
		}
	}
	if n := len(fake.MountedTargets()); n != 0 {
		t.Errorf("%d targets mounted after refused publishes", n)
	}
}
