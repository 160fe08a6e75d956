package exepages

import (
	"strings"
	"testing"
)

func TestParseSmaps(t *testing.T) {
	const exe = "/usr/local/bin/my driver"
	smaps := `00400000-00a00000 r-xp 00000000 fd:01 1234                               /usr/local/bin/my driver
Size:               6144 kB
Rss:                4096 kB
VmFlags: rd ex mr mw me
00a00000-00e00000 r--p 00600000 fd:01 1234                               /usr/local/bin/my driver
Rss:                 512 kB
VmFlags: rd mr mw me rr
00e00000-00e40000 rw-p 00a00000 fd:01 1234                               /usr/local/bin/my driver
Rss:                 128 kB
00e40000-00e80000 rw-p 00000000 00:00 0 
Rss:                  64 kB
7f0000000000-7f0000001000 r--p 00000000 fd:01 99                         /usr/local/bin/my
Rss:                   4 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  16 kB
`
	got, err := parseSmaps([]byte(smaps), exe)
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{
		{start: 0x400000, end: 0xa00000, rss: 4096 << 10},
		{start: 0xa00000, end: 0xe00000, rss: 512 << 10, randomRead: true},
		{start: 0xe00000, end: 0xe40000, writable: true, rss: 128 << 10},
	}
	if len(got) != len(want) {
		t.Fatalf("parseSmaps: %d mappings %+v, want %+v", len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	for _, bad := range []string{
		"00400000-00a00000 r-xp 00000000 fd:01 1234 /x\nRss: many kB\n",
		"00400000-00a00000 r-xp 00000000 fd:01 1234 /x\nRss: 4 MB\n",
		"00a00000-00400000 r-xp 00000000 fd:01 1234 /x\n",
		"zz-00400000 r-xp 00000000 fd:01 1234 /x\n",
		"garbage\n",
	} {
		if _, err := parseSmaps([]byte(bad), "/x"); err == nil || !strings.HasPrefix(err.Error(), "smaps: bad") {
			t.Errorf("parseSmaps(%q): %v, want a bad-line error", bad, err)
		}
	}
}
