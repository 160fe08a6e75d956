package admission

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Share is one party's part of a Pool.
type Share struct {
	// Reserved is the amount only this party may hold: no other party can
	// take it, whatever they wait on.
	Reserved int64
	// Max is the most this party holds at once, reserved and shared
	// together. A Max below Reserved is read as Reserved.
	Max int64
}

// Pool is a bounded resource (slots, bytes) partitioned by the parties that
// use it. Each party has a reserve of its own and may borrow from a shared
// remainder up to its Max; so a party that holds all it may (a hung plugin
// whose calls never end) leaves every other party its reserve, and the
// shared part it did not borrow.
//
// A grant is taken from the party's reserve first, then from the shared
// part. Waiters (Acquire) are served first come, first served within a party
// and round-robin between parties, so a party with a long queue cannot keep
// another's waiters from the shared part; TryAcquire never waits.
//
// Parties are named when the Pool is made; Party adds one later (with a
// reserve, only while the shared part can give it). The zero Pool is not
// usable: use NewPool.
type Pool struct {
	mu      sync.Mutex
	shared  int64 // the shared part's size
	free    int64 // of it, not held
	parties map[string]*party
	order   []*party // round-robin order of the parties' queues
	next    int      // where the next round starts
	waiting int      // waiters of all parties
	// unknown is the share of a party that was never named (NewPool's
	// other); nil: such a party is refused.
	unknown *Share
}

type party struct {
	name     string
	share    Share
	reserved int64 // of share.Reserved, held
	borrowed int64 // of the shared part, held by this party
	queue    []*waiter
}

type waiter struct {
	n     int64
	ready chan *Grant // buffered: the granter never blocks
}

// NewPool returns a pool of total units, of which each named party is
// reserved shares[name].Reserved and the rest is shared. It fails when the
// reserves add up to more than total. A party not in shares may still use
// the pool when other is non-nil: it gets that share, with no reserve (its
// Reserved is ignored) unless Party names it first.
func NewPool(total int64, shares map[string]Share, other *Share) (*Pool, error) {
	p := &Pool{parties: map[string]*party{}}
	var reserved int64
	for _, name := range slices.Sorted(maps.Keys(shares)) {
		s := normal(shares[name])
		reserved += s.Reserved
		pt := &party{name: name, share: s}
		p.parties[name] = pt
		p.order = append(p.order, pt)
	}
	if total < 0 || reserved > total {
		return nil, fmt.Errorf("the parties' reserves add up to %d, more than the pool's %d", reserved, total)
	}
	p.shared, p.free = total-reserved, total-reserved
	if other != nil {
		s := normal(Share{Max: other.Max})
		p.unknown = &s
	}
	return p, nil
}

func normal(s Share) Share {
	s.Reserved = max(s.Reserved, 0)
	s.Max = max(s.Max, s.Reserved)
	return s
}

// Grant is what TryAcquire and Acquire admitted. Release it once.
type Grant struct {
	pool     *Pool
	party    *party
	reserved int64
	borrowed int64
	once     sync.Once
}

// Release gives the grant back and serves the waiters it lets in. It may be
// called more than once; only the first call counts. A nil Grant's Release
// does nothing.
func (g *Grant) Release() {
	if g == nil {
		return
	}
	g.once.Do(func() {
		p := g.pool
		p.mu.Lock()
		g.party.reserved -= g.reserved
		g.party.borrowed -= g.borrowed
		p.free += g.borrowed
		p.dispatch()
		p.mu.Unlock()
	})
}

// Refusal says why a party's request was not admitted at once.
type Refusal struct {
	Party string
	// Held is what the party holds; Max its share's bound.
	Held, Max int64
	// Shared is the shared part's size; SharedFree what of it is free.
	Shared, SharedFree int64
	// Unknown: the party was never named and the pool has no share for
	// such parties.
	Unknown bool
	// Never: the request is larger than the party may ever hold.
	Never bool
}

func (r *Refusal) Error() string {
	switch {
	case r.Unknown:
		return fmt.Sprintf("%s has no share of this pool", r.Party)
	case r.Never:
		return fmt.Sprintf("%s may hold at most %d of this pool", r.Party, r.Max)
	case r.Held >= r.Max:
		return fmt.Sprintf("%s holds %d, its share's maximum", r.Party, r.Held)
	}
	return fmt.Sprintf("%s holds %d (at most %d) and the shared %d are taken", r.Party, r.Held, r.Max, r.Shared)
}

// TryAcquire admits n units for party now, or returns a *Refusal. It does
// not wait, and it does not pass a waiter of the same party.
func (p *Pool) TryAcquire(party string, n int64) (*Grant, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pt, err := p.party(party)
	if err != nil {
		return nil, err
	}
	if n > pt.share.Max {
		return nil, p.refusal(pt, true)
	}
	if len(pt.queue) == 0 {
		if g := p.take(pt, n, false); g != nil {
			return g, nil
		}
	}
	return nil, p.refusal(pt, false)
}

// Force grants n units to party whatever its share and the shared part say,
// for what exists already and must be counted (a volume's content found at
// startup): its reserve first, then the shared part, which may go below
// zero. Until enough is released, nothing more is granted from the shared
// part. An unknown party without a share for others gets one with no
// reserve and no maximum of its own.
func (p *Pool) Force(name string, n int64) *Grant {
	p.mu.Lock()
	defer p.mu.Unlock()
	pt, err := p.party(name)
	if err != nil {
		pt = &party{name: name}
		p.parties[name] = pt
		p.order = append(p.order, pt)
	}
	n = max(n, 0)
	fromReserve := min(n, max(pt.share.Reserved-pt.reserved, 0))
	borrow := n - fromReserve
	pt.reserved += fromReserve
	pt.borrowed += borrow
	p.free -= borrow
	return &Grant{pool: p, party: pt, reserved: fromReserve, borrowed: borrow}
}

// Acquire waits for n units for party until ctx ends, and returns ctx's
// error then. A request larger than the party may ever hold is refused at
// once with a *Refusal.
func (p *Pool) Acquire(ctx context.Context, party string, n int64) (*Grant, error) {
	p.mu.Lock()
	pt, err := p.party(party)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	if n > pt.share.Max {
		defer p.mu.Unlock()
		return nil, p.refusal(pt, true)
	}
	if len(pt.queue) == 0 {
		if g := p.take(pt, n, p.waiting > 0); g != nil {
			p.mu.Unlock()
			return g, nil
		}
	}
	w := &waiter{n: n, ready: make(chan *Grant, 1)}
	pt.queue = append(pt.queue, w)
	p.waiting++
	p.mu.Unlock()

	select {
	case g := <-w.ready:
		return g, nil
	case <-ctx.Done():
		p.mu.Lock()
		select {
		case g := <-w.ready: // granted meanwhile: give it back
			p.mu.Unlock()
			g.Release()
		default:
			p.drop(pt, w)
			p.dispatch() // the head may have changed
			p.mu.Unlock()
		}
		return nil, ctx.Err()
	}
}

// party returns the named party, or one made with the pool's share for
// others. p.mu must be held.
func (p *Pool) party(name string) (*party, error) {
	if pt, ok := p.parties[name]; ok {
		return pt, nil
	}
	if p.unknown == nil {
		return nil, &Refusal{Party: name, Unknown: true}
	}
	pt := &party{name: name, share: *p.unknown}
	p.parties[name] = pt
	p.order = append(p.order, pt)
	return pt, nil
}

// take grants n units to pt when they fit: its reserve first, then the
// shared part (not when sharedQueued: others wait for it, and come first).
// p.mu must be held.
func (p *Pool) take(pt *party, n int64, sharedQueued bool) *Grant {
	if pt.reserved+pt.borrowed+n > pt.share.Max {
		return nil
	}
	fromReserve := min(n, pt.share.Reserved-pt.reserved)
	borrow := n - fromReserve
	if borrow > 0 && (borrow > p.free || sharedQueued) {
		return nil
	}
	pt.reserved += fromReserve
	pt.borrowed += borrow
	p.free -= borrow
	return &Grant{pool: p, party: pt, reserved: fromReserve, borrowed: borrow}
}

// dispatch serves waiters round-robin between parties, the head of each
// party's queue, until a whole round grants nothing. p.mu must be held.
func (p *Pool) dispatch() {
	for p.waiting > 0 {
		granted := false
		for i := range p.order {
			pt := p.order[(p.next+i)%len(p.order)]
			if len(pt.queue) == 0 {
				continue
			}
			w := pt.queue[0]
			g := p.take(pt, w.n, false)
			if g == nil {
				continue
			}
			pt.queue = pt.queue[1:]
			p.waiting--
			w.ready <- g
			granted = true
			p.next = (p.next + i + 1) % len(p.order)
			break
		}
		if !granted {
			return
		}
	}
}

// drop removes w from pt's queue. p.mu must be held.
func (p *Pool) drop(pt *party, w *waiter) {
	for i, x := range pt.queue {
		if x == w {
			pt.queue = append(pt.queue[:i:i], pt.queue[i+1:]...)
			p.waiting--
			return
		}
	}
}

func (p *Pool) refusal(pt *party, never bool) *Refusal {
	return &Refusal{Party: pt.name, Held: pt.reserved + pt.borrowed, Max: pt.share.Max, Shared: p.shared, SharedFree: p.free, Never: never}
}

// Usage is what one party holds and waits for.
type Usage struct {
	Held, Reserved, Max int64
	Waiting             int
}

// Usage returns each party's usage, for metrics and tests.
func (p *Pool) Usage() map[string]Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := make(map[string]Usage, len(p.parties))
	for name, pt := range p.parties {
		u[name] = Usage{Held: pt.reserved + pt.borrowed, Reserved: pt.share.Reserved, Max: pt.share.Max, Waiting: len(pt.queue)}
	}
	return u
}

// Shared returns the shared part's size and what of it is free.
func (p *Pool) Shared() (size, free int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.shared, p.free
}
