package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// A debIndex is one architecture's view of a Debian archive: the newest version of
// every package its Packages indexes name (several suites merged: bookworm,
// bookworm-updates, bookworm-security), and which real packages provide each
// virtual one.
type debIndex struct {
	arch     string
	pkgs     map[string]map[string]string // name -> the stanza of its newest version
	provides map[string][]string          // virtual name -> the real packages that provide it
}

func newDebIndex(arch string) *debIndex {
	return &debIndex{arch: arch, pkgs: map[string]map[string]string{}, provides: map[string][]string{}}
}

// add takes one stanza of a Packages index (of this architecture or "all").
func (x *debIndex) add(st map[string]string) {
	name := st["Package"]
	if name == "" || st["Architecture"] != x.arch && st["Architecture"] != "all" {
		return
	}
	if old, ok := x.pkgs[name]; ok && compareVersions(st["Version"], old["Version"]) <= 0 {
		return
	}
	cp := make(map[string]string, len(st))
	for k, v := range st {
		cp[k] = v
	}
	x.pkgs[name] = cp
	for _, group := range parseRelations(st["Provides"]) {
		for _, v := range group {
			if !contains(x.provides[v], name) {
				x.provides[v] = append(x.provides[v], name)
				sort.Strings(x.provides[v])
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// parseRelations splits a Depends-style field into its comma-separated groups of
// "|"-separated alternatives, each a bare package name: architecture qualifiers
// (":any"), version constraints ("(>= 2.34)"), architecture lists ("[amd64]") and
// build profiles ("<!nocheck>") dropped.
func parseRelations(field string) [][]string {
	var out [][]string
	for _, group := range strings.Split(field, ",") {
		var alts []string
		for _, alt := range strings.Split(group, "|") {
			alt = strings.TrimSpace(alt)
			if i := strings.IndexAny(alt, " (<["); i >= 0 {
				alt = alt[:i]
			}
			alt, _, _ = strings.Cut(alt, ":")
			if alt != "" {
				alts = append(alts, alt)
			}
		}
		if len(alts) > 0 {
			out = append(out, alts)
		}
	}
	return out
}

// pick returns the package that satisfies a group of alternatives: the first
// alternative that is a real package, or else is provided by one (the first by
// name of its providers).
func (x *debIndex) pick(alts []string) (string, bool) {
	for _, a := range alts {
		if _, ok := x.pkgs[a]; ok {
			return a, true
		}
		if p := x.provides[a]; len(p) > 0 {
			return p[0], true
		}
	}
	return "", false
}

// closure resolves the packages roots need, following Pre-Depends and Depends
// (not Recommends or Suggests): the roots and every package they need, each pinned
// with the packages it needs in Deps. An Essential package is skipped unless it is
// a root: Debian's policy lets packages leave it out of their dependencies, so it is
// never needed by a dependency edge alone, and an image from scratch holds none
// (an author who wants a shell names it).
func (x *debIndex) closure(roots []string) ([]pin, error) {
	var pins []pin
	seen := map[string]bool{}
	queue := []string{}
	rootSet := map[string]bool{}
	for _, r := range roots {
		name := r
		if _, ok := x.pkgs[r]; !ok {
			if p := x.provides[r]; len(p) > 0 {
				return nil, fmt.Errorf("package %s (%s) is virtual: name one of the packages that provide it (%s)", r, x.arch, strings.Join(p, ", "))
			}
			return nil, fmt.Errorf("package %s (%s): no such package in the index", r, x.arch)
		}
		rootSet[name] = true
		if !seen[name] {
			seen[name] = true
			queue = append(queue, name)
		}
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		st := x.pkgs[name]
		deps := []string{}
		for _, field := range []string{"Pre-Depends", "Depends"} {
			for _, alts := range parseRelations(st[field]) {
				dep, ok := x.pick(alts)
				if !ok {
					return nil, fmt.Errorf("%s (%s) needs %s: no such package in the index, and none provides it", name, x.arch, strings.Join(alts, " | "))
				}
				if dep == name || x.pkgs[dep]["Essential"] == "yes" && !rootSet[dep] || contains(deps, dep) {
					continue
				}
				deps = append(deps, dep)
				if !seen[dep] {
					seen[dep] = true
					queue = append(queue, dep)
				}
			}
		}
		sort.Strings(deps)
		size, _ := strconv.ParseInt(st["Size"], 10, 64)
		pins = append(pins, pin{Arch: x.arch, Package: name, Version: st["Version"], SHA256: st["SHA256"], Size: size, Filename: st["Filename"], Deps: deps})
	}
	return pins, nil
}

// pinnedClosure resolves roots from the pins alone (their Deps), without the network:
// the pins of the roots and of everything they need, roots first (in their order),
// then the others by name. missing names what the pins lack: a root or a needed
// package without a pin, or a pin written before the pins carried dependencies.
func pinnedClosure(pins []pin, arch string, roots []string) (closure []pin, missing []string) {
	seen := map[string]bool{}
	var rest []pin
	var walk func(name string, root bool)
	walk = func(name string, root bool) {
		if seen[name] {
			return
		}
		seen[name] = true
		p, ok := findPin(pins, arch, name)
		if !ok || p.Deps == nil {
			missing = append(missing, arch+"/"+name)
			return
		}
		if root {
			closure = append(closure, p)
		} else {
			rest = append(rest, p)
		}
		for _, d := range p.Deps {
			walk(d, false)
		}
	}
	for _, r := range roots {
		walk(r, true)
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Package < rest[j].Package })
	return append(closure, rest...), missing
}

// mergePins adds what resolved has to the pins: a package already pinned keeps its
// version, sha256 and file (the pins are what makes a build repeatable) and gains the
// dependencies the index names for it; a new one comes as resolved.
func mergePins(pins, resolved []pin) []pin {
	out := append([]pin(nil), pins...)
	for _, r := range resolved {
		found := false
		for i := range out {
			if out[i].Arch == r.Arch && out[i].Package == r.Package {
				out[i].Deps = r.Deps
				found = true
			}
		}
		if !found {
			out = append(out, r)
		}
	}
	return out
}
