package main

import (
	"archive/tar"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// TestSelectPackages: of a closure, the image carries the roots (all their files but
// documentation, or the -files named) and the dependencies whose libraries the ELF
// files load, followed from library to library, and no other (here python3 and
// libicu72, as xfsprogs' real dependencies are); a library no package ships and a
// -files entry no root holds are errors. The ELF files are this machine's mkfs.xfs
// and the libraries it loads, each in a package of its own.
func TestPolicyNames(t *testing.T) {
	for soname, want := range map[string]string{
		"libc.so.6": "libc6 libc-6", "libcom_err.so.2": "libcom-err2 libcom-err-2", "libext2fs.so.2": "libext2fs2 libext2fs-2",
		"libicuuc.so.72": "libicuuc72 libicuuc-72", "liblz4.so.1": "liblz4-1", "ld-linux-x86-64.so.2": "libc6", "ld-linux-aarch64.so.1": "libc6", "libfoo.so": "",
	} {
		if got := strings.Join(policyNames(soname), " "); got != want {
			t.Errorf("policyNames(%s) = %q, want %q", soname, got, want)
		}
	}
}

func TestSelectPackages(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the host's amd64 ELF files")
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Skipf("%v (the host's xfsprogs)", err)
		}
		return b
	}
	mkfs := read("/sbin/mkfs.xfs")
	debs := map[string]*deb{
		"xfsprogs": {Entries: []debEntry{
			{Name: "sbin", Type: tar.TypeDir},
			{Name: "sbin/mkfs.xfs", Type: tar.TypeReg, Mode: 0o755, Data: mkfs},
			{Name: "usr/sbin/xfs_scrub_all", Type: tar.TypeReg, Mode: 0o755, Data: []byte("#!/usr/bin/python3\n")},
			{Name: "usr/share/man/man8/mkfs.xfs.8.gz", Type: tar.TypeReg, Mode: 0o644, Data: []byte("man")},
			{Name: "usr/share/doc/xfsprogs/copyright", Type: tar.TypeReg, Mode: 0o644, Data: []byte("GPL")},
		}},
		"python3":  {Entries: []debEntry{{Name: "usr/lib/python3/dist-packages/x.py", Type: tar.TypeReg, Data: []byte("")}}},
		"libicu72": {Entries: []debEntry{{Name: "usr/lib/x86_64-linux-gnu/libicuuc.so.72", Type: tar.TypeReg, Data: []byte("\x7fELF not loaded")}}},
	}
	closure := []pin{{Package: "xfsprogs"}, {Package: "libicu72"}, {Package: "python3"}}
	// A package per library mkfs.xfs loads, transitively, and the interpreter's as a
	// symlink in libc's package (as Debian's libc6 ships lib64/ld-linux-x86-64.so.2).
	var want []string
	queue := []debEntry{{Name: "sbin/mkfs.xfs", Data: mkfs}}
	seen := map[string]bool{}
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		interp, needed, err := elfNeeds(e.Data)
		if err != nil {
			t.Fatal(err)
		}
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			real, err := filepath.EvalSymlinks("/lib/x86_64-linux-gnu/" + lib)
			if err != nil {
				t.Skip(err)
			}
			data := read(real)
			pkg := "pkg-" + strings.TrimSuffix(lib, filepath.Ext(lib))
			if names := policyNames(lib); len(names) > 0 {
				pkg = names[0] // libinih.so.1: libinih1, as Debian names it
			}
			d := &deb{Entries: []debEntry{{Name: "lib/x86_64-linux-gnu/" + lib, Type: tar.TypeReg, Mode: 0o644, Data: data}}}
			if interp != "" && lib == "libc.so.6" {
				ld := strings.TrimPrefix(interp, "/")
				d.Entries = append(d.Entries,
					debEntry{Name: "lib/x86_64-linux-gnu/ld.so.real", Type: tar.TypeReg, Data: read("/" + interp)},
					debEntry{Name: ld, Type: tar.TypeSymlink, Linkname: "/lib/x86_64-linux-gnu/ld.so.real"},
					debEntry{Name: "usr/lib/x86_64-linux-gnu/gconv/UTF-7.so", Type: tar.TypeReg, Data: []byte("iconv")})
			}
			if have, ok := debs[pkg]; ok { // ld-linux's package is libc6 too
				have.Entries = append(have.Entries, d.Entries...)
			} else {
				debs[pkg] = d
				closure = append(closure, pin{Package: pkg})
				want = append(want, pkg)
			}
			queue = append(queue, debEntry{Name: lib, Data: data})
		}
	}
	if !seen["libc.so.6"] {
		t.Skip("the host's mkfs.xfs does not load libc.so.6")
	}
	sort.Strings(want)
	// xfsprogs needs python3 and libicu72 first: neither is even loaded.
	closure[0].Deps = append([]string{"libicu72", "python3"}, want...)
	loaded := map[string]int{}
	load := func(p pin) (*deb, error) {
		loaded[p.Package]++
		return debs[p.Package], nil
	}

	sel, err := selectPackages("amd64", []string{"xfsprogs"}, nil, closure, load)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sel {
		got = append(got, s.Pin.Package)
	}
	if strings.Join(got, " ") != "xfsprogs "+strings.Join(want, " ") {
		t.Fatalf("selected %v, want xfsprogs and %v (not python3, not libicu72)", got, want)
	}
	if loaded["python3"]+loaded["libicu72"] > 0 {
		t.Errorf("loaded %v: python3 and libicu72 ship no library mkfs.xfs loads", loaded)
	}
	root := sel[0].Spec
	if !root.All || !root.keeps("usr/sbin/xfs_scrub_all") || root.keeps("usr/share/man/man8/mkfs.xfs.8.gz") {
		t.Errorf("the root's files: %+v", root)
	}
	tr := newTree()
	for _, s := range sel {
		if err := addDeb(tr, s.Spec, debs[s.Pin.Package]); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]debEntry{}
	for n, e := range tr.entries {
		files[n] = e
	}
	if _, ok := files["usr/lib/x86_64-linux-gnu/gconv/UTF-7.so"]; ok {
		t.Error("glibc's iconv module in the image")
	}
	if _, ok := files["usr/share/doc/xfsprogs/copyright"]; !ok {
		t.Error("no copyright file")
	}
	if n, problems := elfProblems("amd64", files); n < 2 || len(problems) > 0 {
		t.Errorf("%d ELF files, problems %q", n, problems)
	}

	sel, err = selectPackages("amd64", []string{"xfsprogs"}, []string{"/sbin/mkfs.xfs"}, closure, load)
	if err != nil || strings.Join(sel[0].Spec.Files, " ") != "sbin/mkfs.xfs" || len(sel) != 1+len(want) {
		t.Errorf("-files /sbin/mkfs.xfs: %+v, %v", sel, err)
	}
	if _, err := selectPackages("amd64", []string{"xfsprogs"}, []string{"/sbin/mkfs.ext4"}, closure, load); err == nil || !strings.Contains(err.Error(), "-files sbin/mkfs.ext4: in none of the packages xfsprogs") {
		t.Errorf("-files naming no file of the roots: %v", err)
	}
	var short []pin
	for _, p := range closure {
		if p.Package != "libc6" {
			short = append(short, p)
		}
	}
	if _, err := selectPackages("amd64", []string{"xfsprogs"}, nil, short, load); err == nil || !strings.Contains(err.Error(), "loads ld-linux-x86-64.so.2, which no package of the closure of xfsprogs ships") {
		t.Errorf("without libc's package: %v", err)
	}
}
