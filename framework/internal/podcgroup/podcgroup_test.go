package podcgroup

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

// The content path holds api.Files: each converts to a File as it is (a
// test may import what the package may not).
var _ = File(api.File{Data: []byte("x"), Mode: 0o600})

const testUID = "0b6e7d5c-1f2a-4c3b-9d8e-7f6a5b4c3d2e"

// TestPodPath: the kubelet's names of a pod's cgroup, for both drivers,
// every QoS class and cgroup roots with and without components (and with a
// "-" in one, which systemd's names escape).
func TestPodPath(t *testing.T) {
	const u = "0b6e7d5c_1f2a_4c3b_9d8e_7f6a5b4c3d2e" // testUID, systemd-escaped
	for _, tc := range []struct {
		driver   Driver
		root     string
		qos      QoS
		want     string
		kubepods string
	}{
		{Cgroupfs, "/", Guaranteed, "kubepods/pod" + testUID, "kubepods"},
		{Cgroupfs, "/", Burstable, "kubepods/burstable/pod" + testUID, "kubepods"},
		{Cgroupfs, "/", BestEffort, "kubepods/besteffort/pod" + testUID, "kubepods"},
		{Cgroupfs, "/ephemera-node-a", Burstable, "ephemera-node-a/kubepods/burstable/pod" + testUID, "ephemera-node-a/kubepods"},
		{Cgroupfs, "/a/b", Guaranteed, "a/b/kubepods/pod" + testUID, "a/b/kubepods"},
		{Systemd, "/", Guaranteed, "kubepods.slice/kubepods-pod" + u + ".slice", "kubepods.slice"},
		{Systemd, "/", Burstable, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice", "kubepods.slice"},
		{Systemd, "/", BestEffort, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + u + ".slice", "kubepods.slice"},
		{Systemd, "/ephemera-node-a", Burstable,
			"ephemera_node_a.slice/ephemera_node_a-kubepods.slice/ephemera_node_a-kubepods-burstable.slice/ephemera_node_a-kubepods-burstable-pod" + u + ".slice",
			"ephemera_node_a.slice/ephemera_node_a-kubepods.slice"},
		{Systemd, "/ephemera-node-a", Guaranteed,
			"ephemera_node_a.slice/ephemera_node_a-kubepods.slice/ephemera_node_a-kubepods-pod" + u + ".slice",
			"ephemera_node_a.slice/ephemera_node_a-kubepods.slice"},
	} {
		if got := PodPath(tc.driver, tc.root, tc.qos, testUID); got != tc.want {
			t.Errorf("PodPath(%s, %q, %s) = %q, want %q", tc.driver, tc.root, tc.qos, got, tc.want)
		}
		if got := KubepodsPath(tc.driver, tc.root); got != tc.kubepods {
			t.Errorf("KubepodsPath(%s, %q) = %q, want %q", tc.driver, tc.root, got, tc.kubepods)
		}
	}
}

func TestCheckUID(t *testing.T) {
	for _, ok := range []string{testUID, "a", "d41d8cd98f00b204e9800998ecf8427e", strings.Repeat("a", 64)} {
		if err := checkUID(ok); err != nil {
			t.Errorf("checkUID(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "../x", "a/b", "a_b", "a.slice", "a b", strings.Repeat("a", 65), "a\x00"} {
		if err := checkUID(bad); !errors.Is(err, ErrBadUID) {
			t.Errorf("checkUID(%q): %v, want ErrBadUID", bad, err)
		}
	}
}

func TestHierarchyCheck(t *testing.T) {
	for _, h := range []Hierarchy{
		{Driver: "docker"},
		{Mount: "sys/fs/cgroup"},
		{Root: "node-a"},
		{Version: 7},
	} {
		if _, err := Open(h); err == nil || errors.Is(err, ErrUnsupported) {
			t.Errorf("Open(%+v): %v, want a configuration error", h, err)
		}
	}
	h := Hierarchy{Root: "/node-a/", Version: V1}
	h.setDefaults()
	if h.Root != "/node-a" || h.Mount != DefaultMount || h.Driver != Cgroupfs {
		t.Errorf("defaults: %+v", h)
	}
}

func TestPlan(t *testing.T) {
	files := map[string]File{
		"b":       {Data: []byte("bb"), Mode: 0o400},
		"a/x":     {Data: []byte("x")},
		"a/y/z":   {Data: nil, Mode: 0o4755}, // setuid is not a permission bit
		"..2020x": {Data: []byte("dots are fine")},
	}
	entries, data, err := plan(files, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := []entry{{"..2020x", 0o644, 13}, {"a/x", 0o644, 1}, {"a/y/z", 0o755, 0}, {"b", 0o400, 2}}
	if len(entries) != len(want) {
		t.Fatalf("plan: %+v, want %+v", entries, want)
	}
	for i := range want {
		if entries[i] != want[i] || string(data[i]) != string(files[want[i].name].Data) {
			t.Errorf("entry %d: %+v, want %+v", i, entries[i], want[i])
		}
	}

	for name, bad := range map[string]struct {
		files map[string]File
		l     Limits
	}{
		"empty name":   {map[string]File{"": {}}, Limits{}},
		"absolute":     {map[string]File{"/etc/passwd": {}}, Limits{}},
		"dot-dot":      {map[string]File{"a/../../x": {}}, Limits{}},
		"dot":          {map[string]File{"./x": {}}, Limits{}},
		"double slash": {map[string]File{"a//x": {}}, Limits{}},
		"trailing":     {map[string]File{"a/": {}}, Limits{}},
		"backslash":    {map[string]File{`a\x`: {}}, Limits{}},
		"nul":          {map[string]File{"a\x00": {}}, Limits{}},
		"file and dir": {map[string]File{"a": {}, "a/b": {}}, Limits{}},
		"too many":     {map[string]File{"a": {}, "b": {}}, Limits{MaxFiles: 1}},
		"too big":      {map[string]File{"a": {Data: make([]byte, 10)}}, Limits{MaxBytes: 9}},
	} {
		if _, _, err := plan(bad.files, bad.l); !errors.Is(err, ErrBadFiles) {
			t.Errorf("%s: plan: %v, want ErrBadFiles", name, err)
		}
	}
}

// TestProtocol: a request's header survives encoding, and a header the
// writer did not get from a parent is refused.
func TestProtocol(t *testing.T) {
	entries, _, err := plan(map[string]File{"a": {Data: []byte("1")}, "d/b": {Mode: 0o600}}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	req := request{deadline: 1234567890123, gid: 2000, dirMode: 0o750, sync: true, files: entries}
	got, err := decode(bufio.NewReader(bytes.NewReader(append(req.encode(), "1"...))))
	if err != nil {
		t.Fatal(err)
	}
	if got.deadline != req.deadline || got.gid != req.gid || got.dirMode != req.dirMode || got.sync != req.sync || len(got.files) != 2 || got.files[0] != req.files[0] || got.files[1] != req.files[1] {
		t.Errorf("decode(encode(%+v)) = %+v", req, got)
	}
	noGID := request{gid: -1, files: nil}
	if got, err := decode(bufio.NewReader(bytes.NewReader(noGID.encode()))); err != nil || got.gid != -1 || got.sync {
		t.Errorf("decode(encode(%+v)) = %+v, %v", noGID, got, err)
	}

	good := req.encode()
	for name, bad := range map[string][]byte{
		"empty":     nil,
		"magic":     append([]byte("ephemera-writer/0\n"), good[len(magic):]...),
		"truncated": good[:len(good)-3],
		"order":     request{gid: -1, files: []entry{{name: "b"}, {name: "a"}}}.encode(),
		"duplicate": request{gid: -1, files: []entry{{name: "a"}, {name: "a"}}}.encode(),
		"dot-dot":   request{gid: -1, files: []entry{{name: "../a"}}}.encode(),
		"absolute":  request{gid: -1, files: []entry{{name: "/a"}}}.encode(),
	} {
		if _, err := decode(bufio.NewReader(bytes.NewReader(bad))); !errors.Is(err, errHeader) {
			t.Errorf("%s: decode: %v, want errHeader", name, err)
		}
	}
}

func TestNotFoundError(t *testing.T) {
	e := &NotFoundError{UID: "u", Kubepods: "/k", KubepodsExists: true, Tried: []string{"/k/pod1"}}
	if !errors.Is(e, ErrNotFound) || errors.Is(e, ErrNoPodCgroups) {
		t.Errorf("%v: Is(ErrNotFound) %v, Is(ErrNoPodCgroups) %v", e, errors.Is(e, ErrNotFound), errors.Is(e, ErrNoPodCgroups))
	}
	e.KubepodsExists = false
	if !errors.Is(e, ErrNotFound) || !errors.Is(e, ErrNoPodCgroups) {
		t.Errorf("%v: Is(ErrNotFound) %v, Is(ErrNoPodCgroups) %v", e, errors.Is(e, ErrNotFound), errors.Is(e, ErrNoPodCgroups))
	}
}
