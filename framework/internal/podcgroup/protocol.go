package podcgroup

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
)

// The writer's standard input is a header, then every file's data in the
// header's order, nothing between: the data is streamed from the caller's
// slices to the files, never held whole by the writer.
//
//	magic
//	varint   deadline (Unix nanoseconds; 0: none)
//	varint   group of every file and directory made (-1: left alone)
//	uvarint  mode of the directories it makes
//	byte     1: fsync each file and directory
//	uvarint  number of files, then for each:
//	         uvarint name length, name, uvarint mode, uvarint data length
const magic = "ephemera-writer/1\n"

// maxHeaderFiles bounds the files a writer accepts, whatever the parent's
// Limits (which are lower): a sanity bound on what it allocates.
const maxHeaderFiles = 1 << 20

// entry is one file of a request.
type entry struct {
	name string
	mode fs.FileMode
	size int64
}

// request is what the writer is asked to do.
type request struct {
	deadline int64
	gid      int
	dirMode  fs.FileMode
	sync     bool
	files    []entry
}

// plan checks files against limits and returns the request's entries in a
// fixed order (by name) with their data.
func plan(files map[string]File, l Limits) ([]entry, [][]byte, error) {
	l = l.withDefaults()
	if len(files) > l.MaxFiles {
		return nil, nil, fmt.Errorf("%w: %d files, at most %d", ErrBadFiles, len(files), l.MaxFiles)
	}
	names := make([]string, 0, len(files))
	var total int64
	for name, f := range files {
		if err := checkName(name); err != nil {
			return nil, nil, err
		}
		names = append(names, name)
		total += int64(len(f.Data))
	}
	if total > l.MaxBytes {
		return nil, nil, fmt.Errorf("%w: %d bytes of data, at most %d", ErrBadFiles, total, l.MaxBytes)
	}
	slices.Sort(names)
	// A name may not also be a directory of another ("a" and "a/b").
	for i := 1; i < len(names); i++ {
		if strings.HasPrefix(names[i], names[i-1]+"/") {
			return nil, nil, fmt.Errorf("%w: %q is a file and a directory of %q", ErrBadFiles, clip(names[i-1]), clip(names[i]))
		}
	}
	entries := make([]entry, len(names))
	data := make([][]byte, len(names))
	for i, name := range names {
		f := files[name]
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = 0o644
		}
		entries[i] = entry{name: name, mode: mode, size: int64(len(f.Data))}
		data[i] = f.Data
	}
	return entries, data, nil
}

// encode returns the request's header.
func (r request) encode() []byte {
	b := []byte(magic)
	b = binary.AppendVarint(b, r.deadline)
	b = binary.AppendVarint(b, int64(r.gid))
	b = binary.AppendUvarint(b, uint64(r.dirMode.Perm()))
	if r.sync {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(r.files)))
	for _, f := range r.files {
		b = binary.AppendUvarint(b, uint64(len(f.name)))
		b = append(b, f.name...)
		b = binary.AppendUvarint(b, uint64(f.mode.Perm()))
		b = binary.AppendUvarint(b, uint64(f.size))
	}
	return b
}

var errHeader = errors.New("bad request header")

// decode reads a request's header from br, checking what it can: the
// names (checkName), their order and the counts.
func decode(br *bufio.Reader) (request, error) {
	var r request
	m := make([]byte, len(magic))
	if _, err := io.ReadFull(br, m); err != nil || string(m) != magic {
		return r, fmt.Errorf("%w: no magic (%v)", errHeader, err)
	}
	var err error
	uv := func() uint64 {
		if err != nil {
			return 0
		}
		var v uint64
		v, err = binary.ReadUvarint(br)
		return v
	}
	sv := func() int64 {
		if err != nil {
			return 0
		}
		var v int64
		v, err = binary.ReadVarint(br)
		return v
	}
	r.deadline = sv()
	r.gid = int(sv())
	r.dirMode = fs.FileMode(uv()).Perm()
	if err == nil {
		var b byte
		b, err = br.ReadByte()
		r.sync = b == 1
	}
	n := uv()
	if err != nil {
		return r, fmt.Errorf("%w: %v", errHeader, err)
	}
	if n > maxHeaderFiles {
		return r, fmt.Errorf("%w: %d files", errHeader, n)
	}
	r.files = make([]entry, 0, n)
	for i := uint64(0); i < n; i++ {
		l := uv()
		if err != nil {
			break
		}
		if l == 0 || l > maxName {
			return r, fmt.Errorf("%w: a name of %d bytes", errHeader, l)
		}
		name := make([]byte, l)
		if _, err = io.ReadFull(br, name); err != nil {
			break
		}
		mode := fs.FileMode(uv()).Perm()
		size := uv()
		if err != nil {
			break
		}
		if size > 1<<40 {
			return r, fmt.Errorf("%w: a file of %d bytes", errHeader, size)
		}
		if err := checkName(string(name)); err != nil {
			return r, fmt.Errorf("%w: %v", errHeader, err)
		}
		if k := len(r.files); k > 0 && r.files[k-1].name >= string(name) {
			return r, fmt.Errorf("%w: names out of order", errHeader)
		}
		r.files = append(r.files, entry{name: string(name), mode: mode, size: int64(size)})
	}
	if err != nil {
		return r, fmt.Errorf("%w: %v", errHeader, err)
	}
	return r, nil
}
