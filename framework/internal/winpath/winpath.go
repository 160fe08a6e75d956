package winpath

import "strings"

// Clean returns p in one spelling: "/" and "\" both separate (the result uses
// "\"), the \\?\ and \??\ prefixes are dropped (\\?\UNC\server\share becomes
// \\server\share), a path rooted without a drive is on C:, the drive letter is
// lower case, repeated separators are folded and a trailing one is dropped
// (but not a drive root's or a share's). Everything else keeps its case and
// its "." and ".." elements.
func Clean(p string) string {
	p = strings.ReplaceAll(p, "/", `\`)
	for _, pre := range []string{`\\?\`, `\??\`} {
		if rest, ok := strings.CutPrefix(p, pre); ok {
			if len(rest) >= 4 && strings.EqualFold(rest[:4], `UNC\`) {
				rest = `\\` + rest[4:]
			}
			p = rest
			break
		}
	}
	unc := strings.HasPrefix(p, `\\`)
	if strings.HasPrefix(p, `\`) && !unc {
		p = "c:" + p
	}
	head, rest := "", p
	if unc {
		head, rest = `\\`, p[2:]
	}
	for strings.Contains(rest, `\\`) {
		rest = strings.ReplaceAll(rest, `\\`, `\`)
	}
	p = head + rest
	if len(p) >= 2 && p[1] == ':' {
		p = strings.ToLower(p[:1]) + p[1:]
	}
	if len(p) > 3 && !(unc && strings.Count(p, `\`) <= 3) {
		p = strings.TrimRight(p, `\`)
	}
	return p
}

// Key is Clean folded to lower case: Windows compares paths without regard to
// case, so two paths name the same file when their keys are equal.
func Key(p string) string { return strings.ToLower(Clean(p)) }

// Slash is Clean with "/" as the separator, for parsing with package path.
func Slash(p string) string { return strings.ReplaceAll(Clean(p), `\`, "/") }
