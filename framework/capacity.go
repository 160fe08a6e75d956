package framework

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/ephemera-csi/ephemera/framework/metrics"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// capacity accounts what the node's volumes hold: their number (for
// MaxVolumesPerNode) and the bytes of each backend (for Options.Capacity). It is
// derived from the records, which are durable, so it survives restarts: reconcile
// rebuilds it, a new publish reserves before its intent record is written, and a
// teardown releases after the record is deleted.
//
// One short critical section per new volume and per deletion; republish and
// every read-only RPC never touch it.
type capacity struct {
	maxVolumes int64
	budgets    map[string]int64 // backend → bytes; absent: unlimited

	mu      sync.Mutex
	volumes int64
	count   map[string]int64 // backend → volumes
	used    map[string]int64 // backend → bytes
}

func newCapacity(maxVolumes int64, budgets map[string]int64) *capacity {
	return &capacity{maxVolumes: maxVolumes, budgets: budgets, count: map[string]int64{}, used: map[string]int64{}}
}

// reset recomputes usage from the records.
func (c *capacity) reset(recs []*store.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes = int64(len(recs))
	c.count = map[string]int64{}
	c.used = map[string]int64{}
	for _, r := range recs {
		c.count[r.Backend]++
		c.used[r.Backend] += r.Size
	}
}

// reserve admits one more volume of size bytes on backend, or returns
// ResourceExhausted saying which limit is reached, with the numbers.
func (c *capacity) reserve(driver, backend string, size int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxVolumes > 0 && c.volumes >= c.maxVolumes {
		return status.Errorf(codes.ResourceExhausted, "node already has %d volumes of %s, its maximum (MaxVolumesPerNode %d); the pod can start once other pods on this node end", c.volumes, driver, c.maxVolumes)
	}
	if budget, ok := c.budgets[backend]; ok && c.used[backend]+size > budget {
		return status.Errorf(codes.ResourceExhausted, "backend %s on this node has %s of its %s capacity in use; %s more does not fit (driver capacity budget)",
			backend, bytes(c.used[backend]), bytes(budget), bytes(size))
	}
	c.volumes++
	c.count[backend]++
	c.used[backend] += size
	return nil
}

// release returns what reserve took.
func (c *capacity) release(backend string, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes--
	c.count[backend]--
	c.used[backend] -= size
}

// snapshot returns the volume count and the bytes in use per backend.
func (c *capacity) snapshot() (int64, map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	used := make(map[string]int64, len(c.used))
	for k, v := range c.used {
		used[k] = v
	}
	return c.volumes, used
}

// usage returns the volumes and bytes of each backend, for the metrics (read
// at scrape time, so they are always this accounting).
func (c *capacity) usage() map[string]metrics.Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := make(map[string]metrics.Usage, len(c.count))
	for b, n := range c.count {
		u[b] = metrics.Usage{Volumes: n, Bytes: c.used[b]}
	}
	return u
}

func bytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// validateCapacity checks Options.Capacity against the backends.
func validateCapacity(budgets map[string]int64, backends map[string]Backend) error {
	for name, n := range budgets {
		if _, ok := backends[name]; !ok {
			return fmt.Errorf("Capacity names backend %q, which the driver does not have", name)
		}
		if n <= 0 {
			return fmt.Errorf("Capacity for backend %q must be positive, got %d", name, n)
		}
	}
	return nil
}
