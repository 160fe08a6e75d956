package capacity

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Fuzz input format, one byte at a time (a missing byte reads as 0):
//
//	config: bit 0 sets MaxVolumesPerNode to 1+bits 1-3; bits 4-5 and 6-7
//	        pick the budgets of backends "a" and "b" from fuzzBudgets ("c" and
//	        "gone" have none)
//	then operations, each an op byte followed by its arguments:
//	  0 reserve:     backend, size
//	  1 release:     index of an admitted volume
//	  2 reset:       record count n (mod 8), then n × (backend, size)
//	  3 stray release (only when nothing is admitted): backend, size
//
// A backend byte picks from fuzzBackends. A size is a selector byte: below
// len(fuzzSizes) it picks an interesting value, otherwise the next 8 bytes are
// a big-endian int64.
const maxFuzzSteps = 256

const (
	opReserve = iota
	opRelease
	opReset
	opStrayRelease
	opCount
)

var (
	fuzzBackends = []string{"a", "b", "c", "gone"}
	fuzzBudgets  = []int64{10 << 20, 1, math.MaxInt64, 1 << 62}
	fuzzSizes    = []int64{0, 1, -1, 1 << 20, 10 << 20, 1 << 30, 9223372036854700000, math.MaxInt64, math.MaxInt64 - 1,
		math.MinInt64, 1 << 62, 1<<62 + 1, 10<<20 - 1}
)

type fuzzReader struct{ b []byte }

func (r *fuzzReader) more() bool { return len(r.b) > 0 }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) backend() string { return fuzzBackends[int(r.byte())%len(fuzzBackends)] }

func (r *fuzzReader) size() int64 {
	if sel := int(r.byte()); sel < len(fuzzSizes) {
		return fuzzSizes[sel]
	}
	var buf [8]byte
	for i := range buf {
		buf[i] = r.byte()
	}
	return int64(binary.BigEndian.Uint64(buf[:]))
}

// fuzzVol is a volume the model admitted.
type fuzzVol struct {
	backend string
	size    int64 // >= 0
}

// capacityModel is the obvious implementation: a list of volumes, and per
// backend their number and the sum of their sizes in math/big.
type capacityModel struct {
	maxVolumes int64
	budgets    map[string]int64
	vols       []fuzzVol
	sums       map[string]*big.Int
	counts     map[string]int64
	// overBudget: the last reset loaded more than the backend's budget (records
	// admitted under an older, larger budget), so used may exceed it.
	overBudget map[string]bool
	overMax    bool // likewise for MaxVolumesPerNode
}

func newCapacityModel(maxVolumes int64, budgets map[string]int64) *capacityModel {
	m := &capacityModel{maxVolumes: maxVolumes, budgets: budgets}
	m.clear()
	return m
}

func (m *capacityModel) clear() {
	m.vols, m.sums, m.counts, m.overBudget = nil, map[string]*big.Int{}, map[string]int64{}, map[string]bool{}
	for _, b := range fuzzBackends {
		m.sums[b] = new(big.Int)
	}
}

func (m *capacityModel) add(v fuzzVol) {
	m.vols = append(m.vols, v)
	m.sums[v.backend].Add(m.sums[v.backend], big.NewInt(v.size))
	m.counts[v.backend]++
}

func (m *capacityModel) remove(i int) fuzzVol {
	v := m.vols[i]
	m.vols = append(m.vols[:i], m.vols[i+1:]...)
	m.sums[v.backend].Sub(m.sums[v.backend], big.NewInt(v.size))
	m.counts[v.backend]--
	return v
}

func (m *capacityModel) sum(backend string) *big.Int { return m.sums[backend] }

func (m *capacityModel) count(backend string) int64 { return m.counts[backend] }

// admits says whether a reserve must succeed, and if not its code.
func (m *capacityModel) admits(backend string, size int64) (bool, codes.Code) {
	if size < 0 {
		return false, codes.InvalidArgument
	}
	if m.maxVolumes > 0 && int64(len(m.vols)) >= m.maxVolumes {
		return false, codes.ResourceExhausted
	}
	if budget, ok := m.budgets[backend]; ok {
		if size > budget {
			return false, codes.InvalidArgument // never fits
		}
		total := new(big.Int).Add(m.sum(backend), big.NewInt(size))
		if total.Cmp(big.NewInt(budget)) > 0 {
			return false, codes.ResourceExhausted
		}
	}
	return true, codes.OK
}

func saturated(s *big.Int) int64 {
	if !s.IsInt64() {
		return math.MaxInt64
	}
	return s.Int64()
}

// FuzzCapacity runs sequences of reserve, release and reset against the
// capacity accounting and a model of it. After every operation: the volume
// count and each backend's count and bytes equal the model's (bytes are the
// sum of admitted sizes, saturated at math.MaxInt64), nothing is negative, a
// budgeted backend's bytes never exceed its budget and the volume count never
// exceeds MaxVolumesPerNode (unless the last reset loaded more than that, and
// then no reserve adds to it), and snapshot and usage agree.
func FuzzCapacity(f *testing.F) {
	reserve := func(backend byte, size ...byte) []byte { return append([]byte{opReserve, backend}, size...) }
	release := func(i byte) []byte { return []byte{opRelease, i} }
	seq := func(config byte, ops ...[]byte) []byte {
		b := []byte{config}
		for _, op := range ops {
			b = append(b, op...)
		}
		return b
	}
	// The reported break: 10Mi budget, 1Mi in use, then a size just below 2^63
	// wraps used+size; then 1Gi is admitted too.
	f.Add(seq(0, reserve(0, 3), reserve(0, 6), reserve(0, 5), reserve(0, 3)))
	// The same on an unbudgeted backend: the sum saturates, release after it.
	f.Add(seq(0, reserve(2, 7), reserve(2, 7), reserve(2, 7), release(1), release(0), reserve(2, 1)))
	// Negative and MinInt64 sizes, then a stray release on an empty node.
	f.Add(seq(0, reserve(0, 2), reserve(2, 9), []byte{opStrayRelease, 0, 7}, reserve(0, 4)))
	// A reset with records over the budget and negative sizes, then releases
	// and reserves; MaxVolumesPerNode 2.
	f.Add(seq(1|1<<1, []byte{opReset, 5, 0, 7, 0, 7, 1, 2, 3, 9, 2, 8}, release(0), reserve(0, 1), release(0), reserve(0, 12), reserve(1, 0)))
	// Exactly filling a budget of 1<<62, then one byte more.
	f.Add(seq(3<<4, reserve(0, 10), reserve(0, 10), reserve(0, 1)))
	// Raw sizes.
	f.Add(seq(2<<4, reserve(0, 255, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe), reserve(0, 255, 0, 0, 0, 0, 0, 0, 0, 1)))

	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzReader{b: data}
		config := r.byte()
		var maxVolumes int64
		if config&1 != 0 {
			maxVolumes = 1 + int64(config>>1&7)
		}
		budgets := map[string]int64{
			"a": fuzzBudgets[config>>4&3],
			"b": fuzzBudgets[config>>6&3],
		}
		c := New(maxVolumes, 0, budgets)
		m := newCapacityModel(maxVolumes, budgets)

		// Long sequences add little and the model is quadratic: stop after
		// maxFuzzSteps operations.
		for step := 0; r.more() && step < maxFuzzSteps; step++ {
			var desc string
			op := int(r.byte()) % opCount
			switch op {
			case opReserve:
				backend, size := r.backend(), r.size()
				desc = fmt.Sprintf("reserve(%s, %d)", backend, size)
				want, code := m.admits(backend, size)
				err := c.Reserve("fuzz", backend, "pod", size)
				if got := err == nil; got != want {
					t.Fatalf("step %d %s: err %v, model admits %v (model %+v)", step, desc, err, want, m.vols)
				}
				if err != nil && status.Code(errkind.Status(err)) != code {
					t.Fatalf("step %d %s: code %v, want %v: %v", step, desc, status.Code(errkind.Status(err)), code, err)
				}
				if err == nil {
					m.add(fuzzVol{backend, size})
					if budget, ok := budgets[backend]; ok && size > 0 {
						if _, used := c.Snapshot(); used[backend] > budget {
							t.Fatalf("step %d %s: admitted, and %s now has %d bytes of its budget %d", step, desc, backend, used[backend], budget)
						}
					}
					if n, _ := c.Snapshot(); maxVolumes > 0 && n > maxVolumes {
						t.Fatalf("step %d %s: admitted the %dth volume over MaxVolumesPerNode %d", step, desc, n, maxVolumes)
					}
				}
			case opRelease:
				if len(m.vols) == 0 {
					r.byte()
					continue
				}
				v := m.remove(int(r.byte()) % len(m.vols))
				desc = fmt.Sprintf("release(%s, %d)", v.backend, v.size)
				c.Release(v.backend, "pod", v.size)
			case opReset:
				n := int(r.byte()) % 8
				var recs []*store.Record
				m.clear()
				for range n {
					backend, size := r.backend(), r.size()
					recs = append(recs, &store.Record{Backend: backend, Size: size})
					m.add(fuzzVol{backend, max(size, 0)})
				}
				desc = fmt.Sprintf("reset(%d records)", n)
				c.Reset(recs)
				m.overMax = maxVolumes > 0 && int64(n) > maxVolumes
				for b, budget := range budgets {
					m.overBudget[b] = m.sum(b).Cmp(big.NewInt(budget)) > 0
				}
			case opStrayRelease:
				backend, size := r.backend(), r.size()
				if len(m.vols) != 0 {
					continue
				}
				// A release without its reserve (never done by the driver) must not
				// turn into credit: everything stays at zero.
				desc = fmt.Sprintf("stray release(%s, %d)", backend, size)
				c.Release(backend, "pod", size)
			}

			n, used := c.Snapshot()
			if n != int64(len(m.vols)) || n < 0 {
				t.Fatalf("step %d %s: %d volumes, model %d", step, desc, n, len(m.vols))
			}
			if maxVolumes > 0 && n > maxVolumes && !m.overMax {
				t.Fatalf("step %d %s: %d volumes over MaxVolumesPerNode %d", step, desc, n, maxVolumes)
			}
			u := c.Usage()
			for _, b := range fuzzBackends {
				want := saturated(m.sum(b))
				if used[b] != want || used[b] < 0 {
					t.Fatalf("step %d %s: backend %s has %d bytes, model %d (%v)", step, desc, b, used[b], want, m.sum(b))
				}
				if budget, ok := budgets[b]; ok && used[b] > budget && !m.overBudget[b] {
					t.Fatalf("step %d %s: backend %s has %d bytes, over its budget %d", step, desc, b, used[b], budget)
				}
				if u[b].Bytes != used[b] || u[b].Volumes != m.count(b) || u[b].Volumes < 0 {
					t.Fatalf("step %d %s: usage of %s %+v, snapshot %d bytes, model %d volumes", step, desc, b, u[b], used[b], m.count(b))
				}
			}
		}
	})
}
