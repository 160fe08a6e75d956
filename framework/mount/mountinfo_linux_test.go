//go:build linux

package mount

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseMountInfo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    []MountInfo
		wantErr bool
	}{
		{
			name: "man page example with optional field",
			in:   "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n",
			want: []MountInfo{{ID: 36, ParentID: 35, Major: 98, Minor: 0, Root: "/mnt1", MountPoint: "/mnt2",
				Options: "rw,noatime", FSType: "ext3", Source: "/dev/root", SuperOptions: "rw,errors=continue"}},
		},
		{
			name: "no optional fields",
			in:   "42 27 0:39 / /tmp/mt rw,relatime - tmpfs tmpfs rw,size=1024k",
			want: []MountInfo{{ID: 42, ParentID: 27, Major: 0, Minor: 39, Root: "/", MountPoint: "/tmp/mt",
				Options: "rw,relatime", FSType: "tmpfs", Source: "tmpfs", SuperOptions: "rw,size=1024k"}},
		},
		{
			name: "several optional fields and escapes",
			in: `100 1 259:3 /dir\040with\040space /var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/my\040vol/mount rw,nosuid,nodev shared:5 master:2 propagate_from:3 - ext4 /dev/nvme0n1p3 rw` + "\n" +
				`101 100 0:50 / /a\011tab\012nl\134bs rw - fuse.sshfs user@host:/x\040y rw,user_id=0`,
			want: []MountInfo{
				{ID: 100, ParentID: 1, Major: 259, Minor: 3, Root: "/dir with space",
					MountPoint: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/my vol/mount",
					Options:    "rw,nosuid,nodev", FSType: "ext4", Source: "/dev/nvme0n1p3", SuperOptions: "rw"},
				{ID: 101, ParentID: 100, Major: 0, Minor: 50, Root: "/", MountPoint: "/a\ttab\nnl\\bs",
					Options: "rw", FSType: "fuse.sshfs", Source: "user@host:/x y", SuperOptions: "rw,user_id=0"},
			},
		},
		{
			name: "empty source, blank lines, incomplete escape",
			in:   "\n7 1 0:5 / /x\\04 rw -  none rw\n\n",
			want: []MountInfo{{ID: 7, ParentID: 1, Major: 0, Minor: 5, Root: "/", MountPoint: `/x\04`,
				Options: "rw", FSType: "", Source: "none", SuperOptions: "rw"}},
		},
		{name: "empty", in: "", want: nil},
		{name: "no separator", in: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 ext3 /dev/root rw", wantErr: true},
		{name: "too few after separator", in: "36 35 98:0 /mnt1 /mnt2 rw - ext3 /dev/root", wantErr: true},
		{name: "bad id", in: "x 35 98:0 / / rw - ext3 /dev/root rw", wantErr: true},
		{name: "bad device", in: "36 35 98 / / rw - ext3 /dev/root rw", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMountInfo(strings.NewReader(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReadMountInfo(t *testing.T) {
	infos, err := ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	if MountsAt(infos, "/") == 0 {
		t.Errorf("no mount at / in %d entries", len(infos))
	}
}

func TestMountsAtUnder(t *testing.T) {
	infos := []MountInfo{
		{ID: 1, MountPoint: "/"},
		{ID: 2, MountPoint: "/var/lib/kubelet"},
		{ID: 3, MountPoint: "/var/lib/kubelet/pods/a/mount"},
		{ID: 4, MountPoint: "/var/lib/kubelet/pods/a/mount"},
		{ID: 5, MountPoint: "/var/lib/kubelet2"},
		{ID: 6, MountPoint: "/var/lib"},
	}
	if n := MountsAt(infos, "/var/lib/kubelet/pods/a/mount/"); n != 2 {
		t.Errorf("MountsAt = %d, want 2", n)
	}
	if n := MountsAt(infos, "/nowhere"); n != 0 {
		t.Errorf("MountsAt = %d, want 0", n)
	}
	ids := func(ms []MountInfo) (out []int) {
		for _, m := range ms {
			out = append(out, m.ID)
		}
		return out
	}
	if got := ids(MountsUnder(infos, "/var/lib/kubelet")); !reflect.DeepEqual(got, []int{2, 3, 4}) {
		t.Errorf("MountsUnder(/var/lib/kubelet) = %v, want [2 3 4]", got)
	}
	if got := ids(MountsUnder(infos, "/")); len(got) != len(infos) {
		t.Errorf("MountsUnder(/) = %v, want all", got)
	}
}
