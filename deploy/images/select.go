package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// The multiarch directories and ELF machines of the Linux architectures.
var triplets = map[string]struct {
	dir     string
	machine elf.Machine
}{
	"amd64": {"x86_64-linux-gnu", elf.EM_X86_64},
	"arm64": {"aarch64-linux-gnu", elf.EM_AARCH64},
}

// A selected package is one Debian package whose files the image carries, and which.
type selected struct {
	Pin  pin
	Deb  *deb
	Spec debPackage
}

// docDirs are what a requested package's files leave out: documentation (but each
// package's copyright file, which comes anyway).
var docDirs = []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/", "usr/share/lintian/", "usr/share/bug/"}

func isDoc(name string) bool {
	for _, d := range docDirs {
		if strings.HasPrefix(name, d) {
			return true
		}
	}
	return false
}

// isLib is a file the library rule keeps: below lib/, lib64/ or usr/lib/, but glibc's
// iconv modules (7 MB: nothing in the image converts charsets).
func isLib(name string) bool {
	if strings.Contains(name, "/gconv/") {
		return false
	}
	return strings.HasPrefix(name, "lib/") || strings.HasPrefix(name, "lib64/") || strings.HasPrefix(name, "usr/lib/")
}

// selectPackages decides what of a closure's packages the image carries. A root
// (a package of -packages) comes with its files: the -files that it holds, or all
// of them but documentation when -files names none of its. A package the roots
// need comes only if an ELF file already selected loads a shared library it ships
// (its PT_INTERP or a DT_NEEDED, followed from library to library), and then with
// its libraries (isLib). So the Depends that programs of the roots the image does not
// carry need (xfsprogs's python3 for xfs_scrub_all, libicu72 for xfs_scrub) stay
// pinned but out of the image, and what the image carries resolves inside it.
// closure is roots first (their order), then the rest; load returns a package's
// .deb. Packages are loaded (fetched, decompressed) only as the search reaches them:
// for a library, the package Debian's policy names after its soname first
// (libinih.so.1: libinih1), then the dependencies of the package whose file needs
// it, breadth first, then the rest of the closure.
func selectPackages(arch string, roots, files []string, closure []pin, load func(pin) (*deb, error)) ([]selected, error) {
	tr, ok := triplets[arch]
	if !ok {
		return nil, fmt.Errorf("architecture %s: no multiarch triplet known", arch)
	}
	searchDirs := []string{"lib/" + tr.dir, "usr/lib/" + tr.dir, "lib", "usr/lib"}
	isRoot := map[string]bool{}
	for _, r := range roots {
		isRoot[r] = true
	}
	byName := map[string]pin{}
	for _, p := range closure {
		byName[p.Package] = p
	}
	wantFile := map[string]bool{}
	for _, f := range files {
		wantFile[strings.TrimPrefix(path.Clean("/"+f), "/")] = false
	}
	type elfFile struct {
		owner string
		entry debEntry
	}
	var out []selected
	var elfs []elfFile           // ELF files selected, to follow
	present := map[string]bool{} // paths the image carries so far
	for _, p := range closure {
		if !isRoot[p.Package] {
			continue
		}
		d, err := load(p)
		if err != nil {
			return nil, err
		}
		spec := debPackage{Name: p.Package}
		for _, e := range d.Entries {
			if done, ok := wantFile[e.Name]; ok && !done && e.Type != tar.TypeDir {
				spec.Files = append(spec.Files, e.Name)
				wantFile[e.Name] = true
			}
		}
		if spec.Files == nil {
			spec.All = true
		}
		for _, e := range d.Entries {
			if e.Type == tar.TypeDir || !spec.keeps(e.Name) {
				continue
			}
			present[e.Name] = true
			if data := entryData(d, e); bytes.HasPrefix(data, []byte("\x7fELF")) {
				elfs = append(elfs, elfFile{p.Package, debEntry{Name: e.Name, Data: data}})
			}
		}
		out = append(out, selected{Pin: p, Deb: d, Spec: spec})
	}
	var notFound []string
	for f, done := range wantFile {
		if !done {
			notFound = append(notFound, f)
		}
	}
	if len(notFound) > 0 {
		sort.Strings(notFound)
		return nil, fmt.Errorf("-files %s: in none of the packages %s (%s)", strings.Join(notFound, ","), strings.Join(roots, ","), arch)
	}
	libs := map[string]map[string]bool{} // a dependency's library paths, once loaded
	libsOf := func(name string) (map[string]bool, *deb, error) {
		d, err := load(byName[name])
		if err != nil {
			return nil, nil, err
		}
		if m, ok := libs[name]; ok {
			return m, d, nil
		}
		m := map[string]bool{}
		for _, e := range d.Entries {
			if e.Type != tar.TypeDir && isLib(e.Name) {
				m[e.Name] = true
			}
		}
		libs[name] = m
		return m, d, nil
	}
	// candidates: the packages to search for a library owner needs, in order.
	candidates := func(owner, lib string) []string {
		var order []string
		seen := map[string]bool{}
		add := func(n string) {
			if _, ok := byName[n]; ok && !seen[n] && !isRoot[n] {
				seen[n] = true
				order = append(order, n)
			}
		}
		for _, n := range policyNames(lib) {
			add(n)
		}
		queue := []string{owner}
		visited := map[string]bool{owner: true}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			for _, d := range byName[n].Deps {
				if !visited[d] {
					visited[d] = true
					add(d)
					queue = append(queue, d)
				}
			}
		}
		for _, p := range closure {
			add(p.Package)
		}
		return order
	}
	included := map[string]bool{}
	var deps []selected
	for len(elfs) > 0 {
		e := elfs[0]
		elfs = elfs[1:]
		interp, needed, err := elfNeeds(e.entry.Data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.entry.Name, err)
		}
		var wants [][]string // each a list of candidate paths
		if interp != "" {
			wants = append(wants, []string{interp})
		}
		for _, lib := range needed {
			var cands []string
			for _, d := range searchDirs {
				cands = append(cands, path.Join(d, lib))
			}
			wants = append(wants, cands)
		}
	want:
		for _, cands := range wants {
			for _, c := range cands {
				if present[c] {
					continue want
				}
			}
			for _, name := range candidates(e.owner, path.Base(cands[0])) {
				m, d, err := libsOf(name)
				if err != nil {
					return nil, err
				}
				for _, c := range cands {
					if !m[c] {
						continue
					}
					if included[name] {
						continue want
					}
					included[name] = true
					deps = append(deps, selected{Pin: byName[name], Deb: d, Spec: debPackage{Name: name}})
					for _, le := range d.Entries {
						if le.Type == tar.TypeDir || !isLib(le.Name) {
							continue
						}
						present[le.Name] = true
						if data := entryData(d, le); bytes.HasPrefix(data, []byte("\x7fELF")) {
							elfs = append(elfs, elfFile{name, debEntry{Name: le.Name, Data: data}})
						}
					}
					continue want
				}
			}
			return nil, fmt.Errorf("%s (%s) loads %s, which no package of the closure of %s ships", e.entry.Name, arch, path.Base(cands[0]), strings.Join(roots, ","))
		}
	}
	sort.Slice(deps, func(i, j int) bool { return deps[i].Pin.Package < deps[j].Pin.Package })
	return append(out, deps...), nil
}

// policyNames are the packages Debian's policy (8.1) names a shared library's
// package after its soname: libfoo.so.1 in libfoo1, libfoo2.so.1 in libfoo2-1,
// with '_' as '-' (libcom_err.so.2: libcom-err2); glibc's dynamic loader is libc6's.
func policyNames(soname string) []string {
	if strings.HasPrefix(soname, "ld-linux") || strings.HasPrefix(soname, "ld64.so") {
		return []string{"libc6"} // glibc's dynamic loader
	}
	base, ver, ok := strings.Cut(soname, ".so.")
	if !ok || base == "" || ver == "" {
		return nil
	}
	base = strings.ToLower(strings.ReplaceAll(base, "_", "-"))
	if c := base[len(base)-1]; c >= '0' && c <= '9' {
		return []string{base + "-" + ver}
	}
	return []string{base + ver, base + "-" + ver}
}

// entryData is a file's bytes, a hard link's those of its target.
func entryData(d *deb, e debEntry) []byte {
	if e.Type != tar.TypeLink {
		return e.Data
	}
	for _, t := range d.Entries {
		if t.Name == e.Linkname {
			return t.Data
		}
	}
	return nil
}

// elfNeeds returns an ELF file's interpreter (relative to the root) and DT_NEEDED names.
func elfNeeds(data []byte) (string, []string, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return "", nil, err
		}
		interp = strings.TrimPrefix(path.Clean(strings.TrimRight(string(b), "\x00")), "/")
	}
	needed, err := f.DynString(elf.DT_NEEDED)
	if err != nil && f.Section(".dynamic") != nil {
		return "", nil, err
	}
	return interp, needed, nil
}
