package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fixtureIndex(t *testing.T) *debIndex {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "Packages"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x := newDebIndex("amd64")
	if err := eachStanza(f, x.add); err != nil {
		t.Fatal(err)
	}
	return x
}

func TestParseRelations(t *testing.T) {
	got := parseRelations("libc6 (>= 2.34), logger | syslog-ng [!hurd-i386], python3:any, foo <!nocheck>,  ")
	want := "libc6;logger|syslog-ng;python3;foo"
	var groups []string
	for _, g := range got {
		groups = append(groups, strings.Join(g, "|"))
	}
	if s := strings.Join(groups, ";"); s != want {
		t.Fatalf("parseRelations: %s, want %s", s, want)
	}
}

// TestClosure resolves a small Packages index: the newest version of a package,
// Pre-Depends and Depends (not Recommends), the first available alternative, a
// virtual package through its first provider by name, ":any" qualifiers,
// Architecture: all, a cycle, and Essential packages left out.
func TestClosure(t *testing.T) {
	x := fixtureIndex(t)
	pins, err := x.closure([]string{"tool"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]pin{}
	var names []string
	for _, p := range pins {
		got[p.Package] = p
		names = append(names, p.Package)
	}
	if want := "tool libc6 libfoo1 syslog-ng exim4-daemon-light python3 tool-data libgcc-s1"; strings.Join(names, " ") != want {
		t.Errorf("closure %s, want %s", strings.Join(names, " "), want)
	}
	tool := got["tool"]
	if tool.Version != "1.0-1" || tool.SHA256 != strings.Repeat("1", 64) || tool.Size != 100 || tool.Filename != "pool/main/t/tool/tool_1.0-1_amd64.deb" || tool.Arch != "amd64" {
		t.Errorf("tool pinned as %+v, want its newest version", tool)
	}
	if want := "exim4-daemon-light libc6 libfoo1 python3 syslog-ng tool-data"; strings.Join(tool.Deps, " ") != want {
		t.Errorf("tool needs %v, want %s (no Essential dpkg, no Recommends)", tool.Deps, want)
	}
	if strings.Join(got["libc6"].Deps, " ") != "libgcc-s1" || strings.Join(got["libgcc-s1"].Deps, " ") != "libc6" {
		t.Errorf("the libc6/libgcc-s1 cycle: %v %v", got["libc6"].Deps, got["libgcc-s1"].Deps)
	}
	if got["tool-data"].Deps == nil || len(got["tool-data"].Deps) != 0 {
		t.Errorf("a package needing nothing has Deps %#v, want empty (not nil: nil is an old pin)", got["tool-data"].Deps)
	}
	for _, n := range []string{"dpkg", "tar", "postfix", "armonly", "libold1"} {
		if _, ok := got[n]; ok {
			t.Errorf("%s in the closure", n)
		}
	}
	// An Essential package named as a root comes, with its own Essential dependency left out.
	if pins, err := x.closure([]string{"dpkg"}); err != nil || len(pins) != 1 || pins[0].Package != "dpkg" || len(pins[0].Deps) != 0 {
		t.Errorf("closure of dpkg: %+v, %v", pins, err)
	}
	for root, msg := range map[string]string{
		"broken":               "broken (amd64) needs nowhere | neither: no such package",
		"armonly":              "package armonly (amd64): no such package",
		"mail-transport-agent": "is virtual: name one of the packages that provide it (exim4-daemon-light, postfix)",
	} {
		if _, err := x.closure([]string{root}); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("closure of %s: %v, want %q", root, err, msg)
		}
	}
}

// TestPinnedClosure: the closure found again in the pins alone (roots first, then by
// name), through a pins file; what a pin lacks (an old six-field line, a missing
// package) is named; mergePins keeps a pinned version.
func TestPinnedClosure(t *testing.T) {
	x := fixtureIndex(t)
	resolved, err := x.closure([]string{"tool"})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "debian.pins")
	if err := writePins(file, resolved); err != nil {
		t.Fatal(err)
	}
	pins, err := readPins(file)
	if err != nil {
		t.Fatal(err)
	}
	cl, missing := pinnedClosure(pins, "amd64", []string{"tool"})
	var names []string
	for _, p := range cl {
		names = append(names, p.Package)
	}
	if want := "tool exim4-daemon-light libc6 libfoo1 libgcc-s1 python3 syslog-ng tool-data"; len(missing) > 0 || strings.Join(names, " ") != want {
		t.Fatalf("pinned closure %s (missing %v), want %s", strings.Join(names, " "), missing, want)
	}
	if _, missing := pinnedClosure(pins, "arm64", []string{"tool"}); strings.Join(missing, " ") != "arm64/tool" {
		t.Errorf("another architecture: missing %v", missing)
	}
	old := pin{Arch: "amd64", Package: "libc6", Version: "2.36-8", SHA256: strings.Repeat("e", 64), Size: 1, Filename: "pool/old.deb"}
	legacy := []pin{old, resolved[0]}
	if _, missing := pinnedClosure(legacy, "amd64", []string{"tool"}); !strings.Contains(strings.Join(missing, " "), "amd64/libc6") {
		t.Errorf("a pin without dependencies: missing %v", missing)
	}
	merged := mergePins(legacy, resolved)
	p, _ := findPin(merged, "amd64", "libc6")
	if p.Version != "2.36-8" || p.SHA256 != old.SHA256 || strings.Join(p.Deps, " ") != "libgcc-s1" {
		t.Errorf("merged libc6 pin %+v, want the pinned version with the index's dependencies", p)
	}
	if cl, missing := pinnedClosure(merged, "amd64", []string{"tool"}); len(missing) > 0 || len(cl) != len(resolved) {
		t.Errorf("merged pins: %d pins, missing %v", len(cl), missing)
	}
}

// TestScratchPinsComplete: the committed pins hold the closure of make image's
// packages for both architectures, so make image resolves without the network.
func TestScratchPinsComplete(t *testing.T) {
	pins, err := readPins("debian.pins")
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		cl, missing := pinnedClosure(pins, arch, []string{"e2fsprogs", "xfsprogs"})
		if len(missing) > 0 {
			t.Errorf("debian.pins lacks %v", missing)
		}
		t.Logf("%s: %d packages in the closure of e2fsprogs,xfsprogs", arch, len(cl))
	}
}
