package api

import (
	"fmt"
	"io/fs"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Params are the user's volumeAttributes (kubelet-owned csi.storage.k8s.io/ keys
// removed). Declared attributes (Attributes) are parsed from them; what no
// declaration takes is left for a backend that declares nothing (a plugin,
// which checks them in its own process). Quantity, String and Has read the
// framework's own "size" and "backend"; Only refuses undeclared keys.
type Params map[string]string

// Has reports whether key is set.
func (p Params) Has(key string) bool {
	_, ok := p[key]
	return ok
}

// String returns the value of key, or def when it is not set.
func (p Params) String(key, def string) string {
	if v, ok := p[key]; ok {
		return v
	}
	return def
}

// Quantity parses key as a Kubernetes quantity ("64Mi", "1G", "1048576") and returns
// its value in bytes, or def when unset. Zero, negative and fractional-byte values
// are errors, and so are values of 2^63-1 bytes and more: every whole number from
// 1 to 2^63-2 is accepted however it is written ("7Ei", "1000m"), nothing is
// rounded, capped or wrapped.
func (p Params) Quantity(key string, def int64) (int64, error) {
	v, ok := p[key]
	if !ok {
		return def, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, InvalidParamf("attribute %q: %q is not a quantity (use a value like 64Mi or 1Gi)", key, v)
	}
	if q.Sign() <= 0 {
		return 0, InvalidParamf("attribute %q: %q must be greater than zero", key, v)
	}
	// The parser caps binary-suffixed values above 2^63-1 at 2^63-1 ("8Ei"
	// parses as 9223372036854775807), so that value cannot be told apart from
	// an overflow: it is refused with everything above it.
	if q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.BinarySI)) >= 0 {
		return 0, InvalidParamf("attribute %q: %q is too large; the largest size is %d bytes", key, v, int64(math.MaxInt64-1))
	}
	// Below 2^63-1, Value is q rounded up to a whole number, exactly (AsInt64
	// is not: it fails for "7Ei" and "1000m"); q is whole when it equals it.
	n := q.Value()
	if q.Cmp(*resource.NewQuantity(n, resource.BinarySI)) != 0 {
		return 0, InvalidParamf("attribute %q: %q is not a whole number of bytes", key, v)
	}
	return n, nil
}

// int parses key as a base-10 integer within [min, max], or returns def when
// unset (IntAttr, UIDAttr, GIDAttr).
func (p Params) int(key string, def, min, max int64) (int64, error) {
	v, ok := p[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < min || n > max {
		return 0, InvalidParamf("attribute %q: %q is not an integer between %d and %d", key, v, min, max)
	}
	return n, nil
}

// bool parses key as "true" or "false", or returns def when unset (BoolAttr).
func (p Params) bool(key string, def bool) (bool, error) {
	v, ok := p[key]
	if !ok {
		return def, nil
	}
	switch v {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, InvalidParamf("attribute %q: %q must be \"true\" or \"false\"", key, v)
}

// fileMode parses key as an octal permission mode ("0755", "1777"), or returns
// def when unset (ModeAttr). Only permission, sticky, setgid and setuid bits
// are accepted.
func (p Params) fileMode(key string, def fs.FileMode) (fs.FileMode, error) {
	v, ok := p[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, InvalidParamf("attribute %q: %q is not an octal mode such as 0755", key, v)
	}
	return FileModeOf(uint32(n)), nil
}

// FileModeOf returns the FileMode of the octal mode bits n (permission bits,
// 0o1000 sticky, 0o2000 setgid, 0o4000 setuid; others ignored): the inverse
// of ModeBits.
func FileModeOf(n uint32) fs.FileMode {
	m := fs.FileMode(n & 0o777)
	if n&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	if n&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if n&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	return m
}

// ModeBits returns m's permission, sticky, setgid and setuid bits as the octal
// number chmod(2) and mount options such as tmpfs' mode= use: the inverse of
// FileModeOf.
func ModeBits(m fs.FileMode) uint32 {
	n := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		n |= 0o1000
	}
	if m&fs.ModeSetgid != 0 {
		n |= 0o2000
	}
	if m&fs.ModeSetuid != 0 {
		n |= 0o4000
	}
	return n
}

// Only returns an *UnknownAttributesError naming every attribute not in known,
// so that a typo in a pod spec fails loudly instead of being ignored.
func (p Params) Only(known ...string) error {
	var unknown []string
	for k := range p {
		found := false
		for _, kk := range known {
			if k == kk {
				found = true
				break
			}
		}
		if !found {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	accepted := slices.Clone(known)
	sort.Strings(accepted)
	return &UnknownAttributesError{Unknown: unknown, Accepted: accepted}
}

func quoteAll(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = strconv.Quote(v)
	}
	return strings.Join(q, ", ")
}

// Without returns a copy of p without keys: what a backend wrapper hands the
// backend it wraps after taking its own attributes.
func (p Params) Without(keys ...string) Params {
	c := p.Clone()
	for _, k := range keys {
		delete(c, k)
	}
	return c
}

// Clone returns a copy of p.
func (p Params) Clone() Params {
	if p == nil {
		return nil
	}
	c := make(Params, len(p))
	for k, v := range p {
		c[k] = v
	}
	return c
}

var _ fmt.Stringer = Secrets(nil)
