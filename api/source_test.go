package api

import (
	"io/fs"
	"slices"
	"testing"
)

func TestTmpfsMountData(t *testing.T) {
	uid, gid := uint32(1000), uint32(0)
	for _, tc := range []struct {
		t    Tmpfs
		want []string
	}{
		{Tmpfs{Size: 1 << 20, Mode: 0o755}, []string{"size=1048576", "mode=0755"}},
		{Tmpfs{Size: 64, Inodes: 16, Mode: 0o777 | fs.ModeSticky, UID: &uid, GID: &gid},
			[]string{"size=64", "mode=1777", "uid=1000", "gid=0", "nr_inodes=16"}},
	} {
		if got := tc.t.MountData(); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %q, want %q", tc.t, got, tc.want)
		}
	}
}

func TestSourceCloneIsDeep(t *testing.T) {
	uid := uint32(7)
	s := Source{Options: []string{"a"}, MountOptions: []string{"b"}, Tmpfs: &Tmpfs{Size: 1, UID: &uid}}
	c := s.Clone()
	c.Options[0], c.MountOptions[0] = "x", "y"
	c.Tmpfs.Size, *c.Tmpfs.UID = 2, 8
	if s.Options[0] != "a" || s.MountOptions[0] != "b" || s.Tmpfs.Size != 1 || *s.Tmpfs.UID != 7 {
		t.Fatalf("the clone shares memory with the source: %+v %+v", s, *s.Tmpfs)
	}
}
