package exepages

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// mapping is one file mapping of the executable: its addresses, whether it
// is writable, its resident bytes and whether it is marked for random reads
// (VmFlags "rr").
type mapping struct {
	start, end uintptr
	writable   bool
	rss        uint64
	randomRead bool
}

// resident is the sum of the mappings' resident bytes.
func resident(ms []mapping) uint64 {
	var n uint64
	for _, m := range ms {
		n += m.rss
	}
	return n
}

// parseSmaps returns the mappings of path in the text of an smaps file: each
// mapping is a header line ("start-end perms offset dev inode path") followed
// by its details ("Rss:   123 kB", "VmFlags: rd ex rr", ...).
func parseSmaps(data []byte, path string) ([]mapping, error) {
	var (
		out []mapping
		cur = -1 // index in out of the mapping whose details follow, or -1
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if strings.HasSuffix(fields[0], ":") { // a detail of the mapping above
			if cur >= 0 && fields[0] == "VmFlags:" {
				out[cur].randomRead = slices.Contains(fields[1:], "rr")
			}
			if cur >= 0 && fields[0] == "Rss:" {
				if len(fields) != 3 || fields[2] != "kB" {
					return nil, fmt.Errorf("smaps: bad Rss line %q", line)
				}
				kb, err := strconv.ParseUint(fields[1], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("smaps: bad Rss line %q", line)
				}
				out[cur].rss = kb << 10
			}
			continue
		}
		cur = -1
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok || len(fields) < 5 {
			return nil, fmt.Errorf("smaps: bad mapping line %q", line)
		}
		// The path is the rest of the line after the inode, spaces and all.
		if len(fields) < 6 || mappingPath(line, fields) != path {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("smaps: bad mapping line %q", line)
		}
		out = append(out, mapping{start: uintptr(start), end: uintptr(end), writable: strings.Contains(fields[1], "w")})
		cur = len(out) - 1
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("smaps: %w", err)
	}
	return out, nil
}

// mappingPath returns the path of a mapping's header line: what follows the
// fifth field (the inode), with its own spaces kept.
func mappingPath(line string, fields []string) string {
	rest := line
	for _, f := range fields[:5] {
		i := strings.Index(rest, f)
		rest = rest[i+len(f):]
	}
	return strings.TrimLeft(rest, " \t")
}
