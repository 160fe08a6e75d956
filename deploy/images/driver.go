package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// binaryPath is where the driver of a platform is built: BinOut/OS-ARCH/NAME[.exe].
func (c *buildConfig) binaryPath(p v1.Platform) string {
	name := c.Name
	if p.OS == "windows" {
		name += ".exe"
	}
	return filepath.Join(c.BinOut, p.OS+"-"+p.Architecture, name)
}

// binaries builds the driver for each platform that -bin gives no binary for (go
// build -trimpath, CGO_ENABLED=0, in c.Dir) and returns them with the platforms the
// index holds: all of c.Platforms, but windows/amd64 when it was not asked for
// explicitly and the driver does not build for Windows (said so on c.Log).
func (c *buildConfig) binaries() (map[string]string, []v1.Platform, error) {
	bins := map[string]string{}
	var plats []v1.Platform
	for _, p := range c.Platforms {
		ps := platformString(p)
		if b := c.Binaries[ps]; b != "" {
			bins[ps] = b
			plats = append(plats, p)
			continue
		}
		if c.Main == "" {
			return nil, nil, fmt.Errorf("no driver binary for %s: give -main (or -bin %s=FILE)", ps, ps)
		}
		out := c.binaryPath(p)
		args := []string{"build", "-trimpath"}
		if c.Tags != "" {
			args = append(args, "-tags", c.Tags)
		}
		if c.Ldflags != "" {
			args = append(args, "-ldflags", c.Ldflags)
		}
		args = append(args, "-o", out, c.Main)
		cmd := exec.Command("go", args...)
		cmd.Dir = c.Dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		shown := make([]string, len(args))
		for i, a := range args {
			shown[i] = a
			if strings.ContainsAny(a, " '") {
				shown[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
			}
		}
		fmt.Fprintf(c.Log, "GOOS=%s GOARCH=%s CGO_ENABLED=0 go %s\n", p.OS, p.Architecture, strings.Join(shown, " "))
		if err := cmd.Run(); err != nil {
			if p.OS == "windows" && c.OptionalWindows {
				fmt.Fprintf(c.Log, "%s: the driver does not build for Windows, so the index has no %s image (-platforms %s asks for one and fails instead):\n%s",
					ps, ps, ps, indent(stderr.String()))
				continue
			}
			return nil, nil, fmt.Errorf("go build %s for %s: %v\n%s", c.Main, ps, err, stderr.String())
		}
		bins[ps] = out
		plats = append(plats, p)
	}
	if len(plats) == 0 {
		return nil, nil, fmt.Errorf("no platform to build for")
	}
	return bins, plats, nil
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}

// closures returns, for each Linux architecture of plats, the pins of the closure of
// c.Packages (roots first). The pins hold it when they carry every package of it
// with its dependencies; else, unless c.Offline, the closure is resolved from the
// suites' Packages indexes, added to the pins (a package pinned already keeps its
// version) and the pins file written: commit it, and the next build needs no index.
func (c *buildConfig) closures(plats []v1.Platform) (map[string][]pin, error) {
	var arches []string
	for _, p := range plats {
		if p.OS == "linux" {
			arches = append(arches, p.Architecture)
		}
	}
	out := map[string][]pin{}
	if len(c.Packages) == 0 || len(arches) == 0 {
		return out, nil
	}
	var missing []string
	for _, a := range arches {
		cl, m := pinnedClosure(c.Pins, a, c.Packages)
		out[a] = cl
		missing = append(missing, m...)
	}
	if len(missing) == 0 {
		return out, nil
	}
	if c.Offline {
		return nil, fmt.Errorf("%s lacks %s (or its dependencies), and -offline: run `images pins -pins %s -packages %s` and commit the file",
			c.PinsFile, strings.Join(missing, " "), c.PinsFile, strings.Join(c.Packages, ","))
	}
	fmt.Fprintf(c.Log, "%s lacks %s: resolving %s from the Packages indexes\n", c.PinsFile, strings.Join(missing, " "), strings.Join(c.Packages, ","))
	resolved, err := resolvePins(c.Client, c.Suites, arches, c.Packages, c.Keyring)
	if err != nil {
		return nil, err
	}
	c.Pins = mergePins(c.Pins, resolved)
	if err := writePins(c.PinsFile, c.Pins); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.Log, "wrote %s (%d pins): commit it, so that the next build resolves from it alone\n", c.PinsFile, len(c.Pins))
	for _, a := range arches {
		cl, m := pinnedClosure(c.Pins, a, c.Packages)
		if len(m) > 0 {
			return nil, fmt.Errorf("%s still lacks %s after resolving", c.PinsFile, strings.Join(m, " "))
		}
		out[a] = cl
	}
	return out, nil
}

// writeArchive writes the OCI layout dir as a tar (the oci-archive format: the
// layout's files at its root, sorted, owner root, every time epoch). A non-nil
// index is the archive's index.json instead of the layout's (namedIndex).
func writeArchive(dir, file string, epoch time.Time, index []byte) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		st, err := os.Stat(p)
		if err != nil {
			f.Close()
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch, Mode: 0o644, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		ownIndex := rel == "index.json" && index != nil
		switch {
		case st.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		case ownIndex:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(index))
		default:
			h.Typeflag, h.Size = tar.TypeReg, st.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return err
		}
		if ownIndex {
			if _, err := tw.Write(index); err != nil {
				f.Close()
				return err
			}
		} else if !st.IsDir() {
			src, err := os.Open(p)
			if err != nil {
				f.Close()
				return err
			}
			_, err = src.WriteTo(tw)
			src.Close()
			if err != nil {
				f.Close()
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// namedIndex is the index.json of the archive when the image has a repository:
// the layout's one descriptor of the image index twice, as `ctr images export`
// of both names would write it: named repo:version for containerd
// (io.containerd.image.name, from which `ctr images import` names the image)
// and tagged version (org.opencontainers.image.ref.name, for OCI tools that
// select by tag), then named repo@digest. The kubelet looks a pod's
// REPO:TAG@DIGEST up in containerd as REPO@DIGEST: with the second name a
// plain import serves a pod that names the image by digest, on containerd 1.6
// and 2.x alike, without --base-name and without a pull. The layout keeps its
// one descriptor (push reads it).
func namedIndex(layoutDir, repo, version string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(layoutDir, "index.json"))
	if err != nil {
		return nil, err
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s/index.json: %w", layoutDir, err)
	}
	if len(idx.Manifests) != 1 {
		return nil, fmt.Errorf("%s/index.json: %d descriptors, want the one image index", layoutDir, len(idx.Manifests))
	}
	byTag, byDigest := idx.Manifests[0], idx.Manifests[0]
	byTag.Annotations = map[string]string{
		"io.containerd.image.name":          repo + ":" + version,
		"org.opencontainers.image.ref.name": version,
	}
	byDigest.Annotations = map[string]string{"io.containerd.image.name": repo + "@" + byDigest.Digest.String()}
	idx.Manifests = []v1.Descriptor{byTag, byDigest}
	return json.Marshal(idx)
}
