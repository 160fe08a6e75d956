package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// A suite is one Debian archive suite the pins are taken from.
type suite struct {
	mirror string // e.g. http://deb.debian.org/debian
	name   string // e.g. bookworm-security
}

// The keyring of Debian's archive signing keys (package debian-archive-keyring).
const debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// resolvePins reads the Packages index of each suite and architecture (each index's
// sha256 from the suite's InRelease, whose signature gpgv checks) and pins the newest
// version of every package of the roots' closure (debIndex.closure).
func resolvePins(client *http.Client, suites []suite, arches, roots []string, keyring string) ([]pin, error) {
	var pins []pin
	releases := map[string]string{}
	for _, arch := range arches {
		x := newDebIndex(arch)
		for _, s := range suites {
			release, ok := releases[s.mirror+"/"+s.name]
			if !ok {
				var err error
				release, err = verifiedRelease(client, s, keyring)
				if err != nil {
					return nil, err
				}
				releases[s.mirror+"/"+s.name] = release
			}
			index, url, err := packagesIndex(client, s, release, arch)
			if err != nil {
				return nil, err
			}
			if err := eachStanza(index, x.add); err != nil {
				return nil, fmt.Errorf("%s: %w", url, err)
			}
		}
		c, err := x.closure(roots)
		if err != nil {
			return nil, err
		}
		pins = append(pins, c...)
	}
	return pins, nil
}

// packagesIndex fetches a suite's Packages index of one architecture (compressed with
// gzip or xz, whichever InRelease lists) and checks it against InRelease's sha256.
func packagesIndex(client *http.Client, s suite, release, arch string) (io.Reader, string, error) {
	for _, ext := range []string{".gz", ".xz"} {
		rel := "main/binary-" + arch + "/Packages" + ext
		sum, size, ok := releaseSHA256(release, rel)
		if !ok {
			continue
		}
		url := s.mirror + "/dists/" + s.name + "/" + rel
		data, err := get(client, url, size)
		if err != nil {
			return nil, url, err
		}
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
			return nil, url, fmt.Errorf("%s: sha256 %x, InRelease says %s", url, got, sum)
		}
		if ext == ".gz" {
			r, err := gzip.NewReader(bytes.NewReader(data))
			return r, url, err
		}
		r, err := xz.NewReader(bytes.NewReader(data))
		return r, url, err
	}
	return nil, "", fmt.Errorf("%s/dists/%s/InRelease lists no main/binary-%s/Packages.gz or .xz", s.mirror, s.name, arch)
}

// verifiedRelease fetches a suite's InRelease and returns its signed text, checked by gpgv.
func verifiedRelease(client *http.Client, s suite, keyring string) (string, error) {
	url := s.mirror + "/dists/" + s.name + "/InRelease"
	signed, err := get(client, url, 1<<20)
	if err != nil {
		return "", err
	}
	gpgv, err := exec.LookPath("gpgv")
	if err != nil {
		return "", fmt.Errorf("checking %s: %w (apt-get install gpgv)", url, err)
	}
	cmd := exec.Command(gpgv, "--keyring", keyring, "--output", "-", "-")
	cmd.Stdin = bytes.NewReader(signed)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: signature not good against %s: %v: %s", url, keyring, err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// releaseSHA256 finds a file's sha256 and size in the SHA256 section of a Release text.
func releaseSHA256(release, file string) (string, int64, bool) {
	in := false
	for _, line := range strings.Split(release, "\n") {
		if !strings.HasPrefix(line, " ") {
			in = strings.TrimSpace(line) == "SHA256:"
			continue
		}
		if !in {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == file {
			size, err := strconv.ParseInt(f[1], 10, 64)
			return f[0], size, err == nil
		}
	}
	return "", 0, false
}

// eachStanza calls fn with the single-line fields of each stanza of a Packages file.
func eachStanza(r io.Reader, fn func(map[string]string)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	st := map[string]string{}
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if len(st) > 0 {
				fn(st)
			}
			st = map[string]string{}
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	if len(st) > 0 {
		fn(st)
	}
	return sc.Err()
}

func get(client *http.Client, url string, limit int64) ([]byte, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: over %d bytes", url, limit)
	}
	return data, nil
}
