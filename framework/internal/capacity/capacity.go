package capacity

import (
	"fmt"
	"math"
	"math/bits"
	"sync"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Capacity accounts what the node's volumes hold: their number (for
// MaxVolumesPerNode) and the bytes of each backend (for Options.Limits.Capacity). It is
// derived from the records, which are durable, so it survives restarts: reconcile
// rebuilds it (with what it adopts from the node), a new publish reserves before
// it creates anything, and a teardown releases after the record is deleted.
//
// One short critical section per new volume and per deletion; republish and
// every read-only RPC never touch it.
//
// Sizes are int64 bytes and come from the pod's "size" attribute, so they can be
// as large as math.MaxInt64-1 (api.Params.Quantity). Nothing here adds two of
// them in int64:
//   - reserve refuses when used > budget (possible after a reset from records
//     admitted under a larger budget) and else compares size > budget-used,
//     which cannot overflow because 0 <= used <= budget;
//   - the bytes of each backend are an exact 128-bit sum (byteSum), read
//     saturated at math.MaxInt64, so an unbudgeted backend's total, or records
//     admitted under an older, larger budget, never wrap;
//   - release clamps at zero, and never takes a count below zero.
//
// A size of 0 is a volume without a size (a backend such as dir): it takes a
// volume slot and no bytes. A negative size is refused by reserve
// (the request parser already refuses one; this guards backends whose Validate
// computes the size) and counted as 0 by reset and release.
type Capacity struct {
	maxVolumes int64
	maxPerPod  int64            // volumes of one pod; <= 0: no cap
	budgets    map[string]int64 // backend → bytes; absent: unlimited
	words      words.Words      // the flags of the limits, for the messages

	mu      sync.Mutex
	volumes int64
	count   map[string]int64    // backend → volumes
	used    map[string]*byteSum // backend → bytes
	pods    map[string]int64    // pod UID → volumes
}

func New(maxVolumes int64, maxPerPod int, budgets map[string]int64) *Capacity {
	return &Capacity{maxVolumes: maxVolumes, maxPerPod: int64(maxPerPod), budgets: budgets, count: map[string]int64{}, used: map[string]*byteSum{}, pods: map[string]int64{}}
}

// Reset recomputes usage from the records. A record with a negative size
// (never written by this driver) counts as a volume of 0 bytes.
func (c *Capacity) Reset(recs []*store.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes = int64(len(recs))
	c.count = map[string]int64{}
	c.used = map[string]*byteSum{}
	c.pods = map[string]int64{}
	for _, r := range recs {
		c.count[r.Backend]++
		c.pods[r.Pod.UID]++
		c.bytesOf(r.Backend).add(r.Size)
	}
}

// bytesOf returns the byte sum of backend, creating it. c.mu must be held.
func (c *Capacity) bytesOf(backend string) *byteSum {
	s, ok := c.used[backend]
	if !ok {
		s = &byteSum{}
		c.used[backend] = s
	}
	return s
}

// WithWords makes the messages of c name the flags w knows for its limits.
func (c *Capacity) WithWords(w words.Words) *Capacity {
	c.words = w
	return c
}

// Reserve admits one more volume of size bytes on backend, or returns
// ResourceExhausted saying which limit is reached, with the numbers. What can
// never fit is InvalidArgument, saying that retrying does not help: a volume
// larger than the backend's whole budget (as Options.Limits.Capacity
// documents), a negative size, and a volume past the pod's cap
// (MaxVolumesPerPod).
func (c *Capacity) Reserve(driver, backend, pod string, size int64) error {
	if size < 0 {
		return errkind.Invalidf("volume size %d bytes is negative", size)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxVolumes > 0 && c.volumes >= c.maxVolumes {
		return errkind.Errorf(api.ErrResourceExhausted, "%s", c.words.Say(fmt.Sprintf("node already has %d volumes of %s, its maximum (Limits.MaxVolumesPerNode %d); the pod can start once other pods on this node end", c.volumes, driver, c.maxVolumes)))
	}
	if c.maxPerPod > 0 && c.pods[pod] >= c.maxPerPod {
		return errkind.Invalidf("%s", c.words.Say(fmt.Sprintf("the pod already has %d volumes of %s on this node, the most one pod may have (Limits.MaxVolumesPerPod %d); retrying does not help: give the pod fewer volumes of this driver",
			c.pods[pod], driver, c.maxPerPod)))
	}
	if budget, ok := c.budgets[backend]; ok {
		if size > budget {
			return errkind.Invalidf("%s", c.words.Say(fmt.Sprintf("backend %s on this node has a capacity budget of %s (Limits.Capacity); a volume of %s is larger than the whole budget and never fits on this node, retrying does not help: ask for less, or raise the budget",
				backend, words.Bytes(budget), words.Bytes(size))))
		}
		// used may exceed the budget after a reset from records admitted under
		// a larger one; then nothing fits, not even a volume of 0 bytes. Else
		// 0 <= used <= budget, exactly, and budget-used cannot overflow.
		if s := c.bytesOf(backend); s.over(budget) || size > budget-s.int64() {
			used := s.int64()
			return errkind.Errorf(api.ErrResourceExhausted, "%s", c.words.Say(fmt.Sprintf("backend %s on this node has %s of its %s capacity in use; %s more does not fit (Limits.Capacity); the kubelet retries",
				backend, words.Bytes(used), words.Bytes(budget), words.Bytes(size))))
		}
	}
	c.volumes++
	c.count[backend]++
	c.pods[pod]++
	c.bytesOf(backend).add(size)
	return nil
}

// Release returns what reserve took. Nothing goes below zero, so a release
// without its reserve (a bug) cannot turn into credit for later volumes.
func (c *Capacity) Release(backend, pod string, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch n := c.pods[pod]; {
	case n > 1:
		c.pods[pod] = n - 1
	case n == 1:
		delete(c.pods, pod)
	}
	if c.volumes > 0 {
		c.volumes--
	}
	if n, ok := c.count[backend]; ok && n > 0 {
		c.count[backend] = n - 1
	}
	if s, ok := c.used[backend]; ok {
		s.sub(size)
	}
}

// Snapshot returns the volume count and the bytes in use per backend
// (saturated at math.MaxInt64).
func (c *Capacity) Snapshot() (int64, map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	used := make(map[string]int64, len(c.used))
	for k, v := range c.used {
		used[k] = v.int64()
	}
	return c.volumes, used
}

// Usage returns the volumes and bytes of each backend, for the metrics (read
// at scrape time, so they are always this accounting).
func (c *Capacity) Usage() map[string]metrics.Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := make(map[string]metrics.Usage, len(c.count))
	for b, n := range c.count {
		var bytes int64
		if s, ok := c.used[b]; ok {
			bytes = s.int64()
		}
		u[b] = metrics.Usage{Volumes: n, Bytes: bytes}
	}
	return u
}

// byteSum is an exact sum of volume sizes. 128 bits hold 2^64 sizes of up to
// 2^63 bytes, more volumes than any node has, so the sum never wraps and a
// Release after a reset subtracts from the true total.
type byteSum struct{ hi, lo uint64 }

// add adds n bytes; a negative n counts as 0.
func (s *byteSum) add(n int64) {
	if n <= 0 {
		return
	}
	var carry uint64
	s.lo, carry = bits.Add64(s.lo, uint64(n), 0)
	s.hi += carry
}

// sub subtracts n bytes, stopping at 0; a negative n counts as 0.
func (s *byteSum) sub(n int64) {
	if n <= 0 {
		return
	}
	if s.hi == 0 && s.lo < uint64(n) {
		*s = byteSum{}
		return
	}
	var borrow uint64
	s.lo, borrow = bits.Sub64(s.lo, uint64(n), 0)
	s.hi -= borrow
}

// over reports whether the sum is larger than n (n >= 0).
func (s *byteSum) over(n int64) bool { return s.hi != 0 || s.lo > uint64(n) }

// int64 returns the sum, or math.MaxInt64 when it is larger.
func (s *byteSum) int64() int64 {
	if s.hi != 0 || s.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(s.lo)
}

// Adopt accounts a volume that exists whatever the budget says (adopted, not
// admitted): it never fails.
func (c *Capacity) Adopt(backend, pod string, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes++
	c.count[backend]++
	c.pods[pod]++
	c.bytesOf(backend).add(size)
}

// resize changes the size accounted for one volume of backend.
func (c *Capacity) resize(backend string, from, to int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.bytesOf(backend)
	s.sub(from)
	s.add(to)
}

// Complete moves the capacity a rebuilt record accounted for to what its
// completed record says.
func (c *Capacity) Complete(rebuilt, full *store.Record) {
	if rebuilt.Backend == "" {
		c.Adopt(full.Backend, full.Pod.UID, full.Size)
		c.releaseUnknown(rebuilt.Pod.UID)
		return
	}
	c.resize(full.Backend, rebuilt.Size, full.Size)
}

// releaseUnknown drops a volume accounted under no backend (a rebuilt record
// whose backend was unknown until its publish named it).
func (c *Capacity) releaseUnknown(pod string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes = max(c.volumes-1, 0)
	if n := c.pods[pod]; n > 1 {
		c.pods[pod] = n - 1
	} else {
		delete(c.pods, pod)
	}
	c.count[""] = max(c.count[""]-1, 0)
	if c.count[""] == 0 {
		delete(c.count, "")
		delete(c.used, "")
	}
}
