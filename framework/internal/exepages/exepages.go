package exepages

import "errors"

// ErrUnsupported is Release's error where the platform cannot do it: not
// Linux, or a kernel without MADV_PAGEOUT.
var ErrUnsupported = errors.New("releasing the binary's pages is not supported here")

// Result says what Release did: how many mappings of the executable it
// released and the bytes of all its mappings resident before and after.
type Result struct {
	Mappings       int
	ResidentBefore uint64
	ResidentAfter  uint64
}
