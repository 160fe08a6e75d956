package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// A tree is the content of one layer: paths (relative, "/"-separated) to entries. Its tar
// is the same bytes for the same content: entries sorted by path, parents made as
// directories, owner root, and one modification time for all.
type tree struct {
	entries map[string]debEntry
}

func newTree() *tree { return &tree{entries: map[string]debEntry{}} }

func (t *tree) add(e debEntry) error {
	e.Name = strings.TrimPrefix(path.Clean("/"+e.Name), "/")
	if e.Name == "" {
		return nil
	}
	if old, ok := t.entries[e.Name]; ok {
		if old.Type == tar.TypeDir && e.Type == tar.TypeDir {
			return nil
		}
		if old.Type != e.Type || old.Linkname != e.Linkname || !bytes.Equal(old.Data, e.Data) {
			return fmt.Errorf("%s: two different entries", e.Name)
		}
	}
	t.entries[e.Name] = e
	return nil
}

func (t *tree) file(name string, mode int64, data []byte) error {
	return t.add(debEntry{Name: name, Type: tar.TypeReg, Mode: mode, Data: data})
}

func (t *tree) dir(name string, mode int64) error {
	return t.add(debEntry{Name: name, Type: tar.TypeDir, Mode: mode})
}

// tar writes the tree as an uncompressed tar stream.
func (t *tree) tar(mtime time.Time) ([]byte, error) {
	all := map[string]debEntry{}
	for n, e := range t.entries {
		all[n] = e
		for d := path.Dir(n); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := t.entries[d]; !ok {
				all[d] = debEntry{Name: d, Type: tar.TypeDir, Mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := all[n]
		h := &tar.Header{
			Name:     n,
			Typeflag: e.Type,
			Mode:     e.Mode,
			ModTime:  mtime,
			Uname:    "root",
			Gname:    "root",
			Format:   tar.FormatPAX,
		}
		switch e.Type {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			h.Size = int64(len(e.Data))
		case tar.TypeSymlink:
			h.Linkname = e.Linkname
		case tar.TypeLink:
			if _, ok := all[e.Linkname]; !ok {
				return nil, fmt.Errorf("%s: hard link to %s, which the layer does not hold", n, e.Linkname)
			}
			h.Linkname = e.Linkname
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if e.Type == tar.TypeReg {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// layer makes the tree an OCI layer, gzip-compressed by go-containerregistry with the
// standard library's compress/gzip: the same tar gives the same bytes for one Go release.
func (t *tree) layer(mtime time.Time) (v1.Layer, error) {
	data, err := t.tar(mtime)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}
