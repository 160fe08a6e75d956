package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// A pin is one Debian package of one architecture, as deploy/images/debian.pins names it:
// the version, the pool file below the mirror and the sha256 and size of the .deb.
type pin struct {
	Arch     string
	Package  string
	Version  string
	SHA256   string
	Size     int64
	Filename string
	// Deps are the packages this one needs (Pre-Depends and Depends, resolved to
	// real packages; Essential ones left out): what lets a build find a package's
	// closure in the pins alone. Nil for a line of the six-field format.
	Deps []string
}

const pinsHeader = `# The Debian bookworm packages of a driver's Linux images, one line per
# architecture and package: arch package version sha256 size pool-file deps, deps
# being the packages it needs (Pre-Depends and Depends resolved; "-" for none), so
# that a build finds the closure of its -packages here, without the network.
# Written by ` + "`images pins`" + ` (` + "`make image-pins`" + `: the newest version in bookworm,
# bookworm-updates and bookworm-security, read from InRelease files checked with gpgv
# against debian-archive-keyring), or by ` + "`images build`" + ` when it resolves a package
# not pinned yet; ` + "`images build`" + ` fetches each .deb once into its cache and
# refuses one whose sha256 differs. Debian's mirror drops superseded versions: when a
# pinned one is gone, ` + "`make image`" + ` says so; ` + "`make image-pins`" + ` and a commit of
# this file bring the pins current (docs/operations.md, "The image").
`

func readPins(file string) ([]pin, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var pins []pin
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 6 && len(f) != 7 {
			return nil, fmt.Errorf("%s:%d: want 7 fields (arch package version sha256 size pool-file deps), have %d", file, i+1, len(f))
		}
		size, err := strconv.ParseInt(f[4], 10, 64)
		if err != nil || size <= 0 {
			return nil, fmt.Errorf("%s:%d: size %q is not a positive number", file, i+1, f[4])
		}
		if len(f[3]) != 64 {
			return nil, fmt.Errorf("%s:%d: sha256 %q is not 64 hex digits", file, i+1, f[3])
		}
		if _, err := hex.DecodeString(f[3]); err != nil {
			return nil, fmt.Errorf("%s:%d: sha256 %q is not 64 hex digits", file, i+1, f[3])
		}
		p := pin{Arch: f[0], Package: f[1], Version: f[2], SHA256: f[3], Size: size, Filename: f[5]}
		if len(f) == 7 {
			p.Deps = []string{}
			if f[6] != "-" {
				p.Deps = strings.Split(f[6], ",")
			}
		}
		pins = append(pins, p)
	}
	return pins, nil
}

func writePins(file string, pins []pin) error {
	pins = append([]pin(nil), pins...) // sorted here, the caller's order kept
	sort.Slice(pins, func(i, j int) bool {
		if pins[i].Arch != pins[j].Arch {
			return pins[i].Arch < pins[j].Arch
		}
		return pins[i].Package < pins[j].Package
	})
	var b strings.Builder
	b.WriteString(pinsHeader)
	for _, p := range pins {
		fmt.Fprintf(&b, "%s %s %s %s %d %s", p.Arch, p.Package, p.Version, p.SHA256, p.Size, p.Filename)
		if p.Deps != nil {
			deps := "-"
			if len(p.Deps) > 0 {
				deps = strings.Join(p.Deps, ",")
			}
			fmt.Fprintf(&b, " %s", deps)
		}
		b.WriteString("\n")
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

// errGone is a pinned .deb the mirror no longer has.
var errGone = errors.New("gone from the mirror")

// fetchDeb returns the .deb of p from the cache, or fetches it from the mirror into the
// cache. Either way its sha256 is checked against the pin.
func fetchDeb(client *http.Client, mirror, cache string, p pin) ([]byte, error) {
	name := filepath.Join(cache, p.SHA256[:16]+"_"+path.Base(p.Filename))
	if data, err := os.ReadFile(name); err == nil {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) == p.SHA256 {
			return data, nil
		}
		// A torn or altered cache entry: fetch again.
		_ = os.Remove(name)
	}
	url := strings.TrimSuffix(mirror, "/") + "/" + p.Filename
	resp, err := client.Get(url)
	if err != nil {
		return nil, fmt.Errorf("%s %s (%s): %w", p.Package, p.Version, p.Arch, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone {
		return nil, fmt.Errorf("%s %s (%s): %s: %s: %w", p.Package, p.Version, p.Arch, url, resp.Status, errGone)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s (%s): %s: %s", p.Package, p.Version, p.Arch, url, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, p.Size+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != p.SHA256 {
		return nil, fmt.Errorf("%s: sha256 %x, the pin says %s (size %d, pinned %d): refusing it", url, sum, p.SHA256, len(data), p.Size)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(cache, ".fetch-*")
	if err != nil {
		return nil, err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return nil, err
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		os.Remove(tmp.Name())
		return nil, err
	}
	return data, nil
}

// A debEntry is one member of a .deb's data.tar: a regular file, a directory, a symlink
// or a hard link (to another member).
type debEntry struct {
	Name     string // without a leading "./" or "/"
	Type     byte   // tar.TypeReg, TypeDir, TypeSymlink, TypeLink
	Mode     int64
	Linkname string
	Data     []byte
}

// A deb is what a .deb holds: its control stanza and the entries of its data.tar.
type deb struct {
	Control string
	Entries []debEntry
}

// parseDeb reads a .deb (an ar archive of debian-binary, control.tar.* and data.tar.*;
// xz or gzip compressed, as bookworm's are) without dpkg.
func parseDeb(data []byte) (*deb, error) {
	const magic = "!<arch>\n"
	if !bytes.HasPrefix(data, []byte(magic)) {
		return nil, errors.New("not an ar archive")
	}
	var d deb
	var haveControl, haveData bool
	off := len(magic)
	for off+60 <= len(data) {
		hdr := data[off : off+60]
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
		if err != nil || size < 0 || int64(off+60)+size > int64(len(data)) {
			return nil, fmt.Errorf("ar member %q: bad size", name)
		}
		body := data[off+60 : off+60+int(size)]
		off += 60 + int(size)
		if off%2 == 1 {
			off++
		}
		switch {
		case strings.HasPrefix(name, "control.tar"):
			r, err := decompress(name, body)
			if err != nil {
				return nil, err
			}
			err = walkTar(r, func(h *tar.Header, r io.Reader) error {
				if path.Clean(strings.TrimPrefix(h.Name, "./")) == "control" {
					b, err := io.ReadAll(r)
					d.Control = string(b)
					return err
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			haveControl = d.Control != ""
		case strings.HasPrefix(name, "data.tar"):
			r, err := decompress(name, body)
			if err != nil {
				return nil, err
			}
			err = walkTar(r, func(h *tar.Header, r io.Reader) error {
				n := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
				if n == "" {
					return nil
				}
				e := debEntry{Name: n, Mode: h.Mode & 0o7777}
				switch h.Typeflag {
				case tar.TypeReg:
					e.Type = tar.TypeReg
					b, err := io.ReadAll(r)
					if err != nil {
						return err
					}
					e.Data = b
				case tar.TypeDir:
					e.Type = tar.TypeDir
				case tar.TypeSymlink:
					e.Type, e.Linkname = tar.TypeSymlink, h.Linkname
				case tar.TypeLink:
					e.Type, e.Linkname = tar.TypeLink, strings.TrimPrefix(path.Clean("/"+h.Linkname), "/")
				default:
					return fmt.Errorf("%s: tar type %q not supported", h.Name, h.Typeflag)
				}
				d.Entries = append(d.Entries, e)
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			haveData = true
		}
	}
	if !haveControl || !haveData {
		return nil, errors.New("no control.tar or data.tar member: not a .deb")
	}
	return &d, nil
}

func decompress(name string, body []byte) (io.Reader, error) {
	switch path.Ext(name) {
	case ".xz":
		r, err := xz.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return r, nil
	case ".gz":
		return gzip.NewReader(bytes.NewReader(body))
	case ".tar":
		return bytes.NewReader(body), nil
	}
	return nil, fmt.Errorf("%s: compression not supported (xz, gzip or none)", name)
}

func walkTar(r io.Reader, fn func(*tar.Header, io.Reader) error) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(h, tr); err != nil {
			return err
		}
	}
}

// controlField returns one field of a control stanza.
func controlField(stanza, key string) string {
	sc := bufio.NewScanner(strings.NewReader(stanza))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// compareVersions compares two Debian versions (epoch:upstream-revision) the way dpkg does.
func compareVersions(a, b string) int {
	ea, ua, ra := splitVersion(a)
	eb, ub, rb := splitVersion(b)
	if ea != eb {
		if ea < eb {
			return -1
		}
		return 1
	}
	if c := compareFragment(ua, ub); c != 0 {
		return c
	}
	return compareFragment(ra, rb)
}

func splitVersion(v string) (epoch int, upstream, revision string) {
	if e, rest, ok := strings.Cut(v, ":"); ok {
		epoch, _ = strconv.Atoi(e)
		v = rest
	}
	if i := strings.LastIndex(v, "-"); i >= 0 {
		return epoch, v[:i], v[i+1:]
	}
	return epoch, v, ""
}

func order(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return 0
	case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
		return int(c)
	case c == '~':
		return -1
	case c == 0:
		return 0
	}
	return int(c) + 256
}

func compareFragment(a, b string) int {
	for a != "" || b != "" {
		// The non-digit prefix, character by character ('~' before everything, letters before others).
		for (a != "" && !isDigit(a[0])) || (b != "" && !isDigit(b[0])) {
			var ca, cb byte
			if a != "" && !isDigit(a[0]) {
				ca = a[0]
			}
			if b != "" && !isDigit(b[0]) {
				cb = b[0]
			}
			if oa, ob := order(ca), order(cb); oa != ob {
				if oa < ob {
					return -1
				}
				return 1
			}
			if ca != 0 {
				a = a[1:]
			}
			if cb != 0 {
				b = b[1:]
			}
		}
		// The digit run, numerically.
		var na, nb string
		na, a = digits(a)
		nb, b = digits(b)
		na, nb = strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
		if len(na) != len(nb) {
			if len(na) < len(nb) {
				return -1
			}
			return 1
		}
		if na != nb {
			if na < nb {
				return -1
			}
			return 1
		}
	}
	return 0
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func digits(s string) (string, string) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return s[:i], s[i:]
}
