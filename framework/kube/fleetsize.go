package kube

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/spread"
)

// FleetSizeReadWindow is the window over which the drivers of a fleet that
// remember no size spread their one read of it (FleetSize.Size): 30 s, so
// that a fleet-wide first start of 5,000 drivers (an install, or nodes whose
// state directories are new) makes its first contacts with the API server
// (a TLS handshake, a token check, the GET) at about 170 a second, not all in
// the first seconds. In the fleet simulation 2,000 drivers reading within
// 5 s made the kube-system client's slow requests (docs/operations.md, "At
// fleet scale").
const FleetSizeReadWindow = spread.FirstRead

// FleetSizeRefresh is how often Run reads the size again while the driver
// runs (jittered from half to one and a half times): one GET a driver, so
// that a fleet of 5,000 makes about 0.2 a second, and a driver that runs
// for months still remembers its fleet's size of late.
const FleetSizeRefresh = 6 * time.Hour

// fleetSizeTimeout bounds one read of the size.
const fleetSizeTimeout = 10 * time.Second

// FleetSizeOptions configure NewFleetSize.
type FleetSizeOptions struct {
	// Get reads the current size: Client.DaemonSetSize of the driver's own
	// DaemonSet. Required.
	Get func(ctx context.Context) (int, error)
	// Path is the file that remembers the size from the last start: one in
	// the driver's state directory, which outlives the driver's pod (its
	// directory must exist). Empty: nothing is remembered, every start reads
	// the size, spread over FleetSizeReadWindow.
	Path string

	// delay picks a wait from [0, max); tests set it.
	delay func(max time.Duration) time.Duration
}

// FleetSize is how many drivers may start at once with this one, for
// PodsOptions.FleetSize and the framework's ObservabilityOptions.FleetSize:
// one answer per start, shared by both. A start that finds the size
// remembered in Path answers from it without a request, so that its first
// request is the spread work itself; Run then reads the current size at a
// random point of that size's window (FleetStartJitter) and remembers it for
// the next start. A start that finds none (the first one, a node's first, or
// every start while the read fails) reads it at a random point of
// FleetSizeReadWindow from NewFleetSize: the callers' start-up work waits for
// the answer, which no publish waits for. Run reads it again every
// FleetSizeRefresh.
type FleetSize struct {
	opts  FleetSizeOptions
	start time.Time
	// first is the point after start at which a start without a
	// remembered size reads it.
	first time.Duration
	// found is the size Path held at NewFleetSize, 0 if none.
	found int

	// sem holds the answer's lock: a channel, so that a caller waiting
	// for it can give up with its context.
	sem  chan struct{}
	done bool // n and err are the answer
	n    int
	err  error
}

// NewFleetSize returns a FleetSize: call it when the driver starts, since a
// start that remembers no size spreads its read from then.
func NewFleetSize(opts FleetSizeOptions) (*FleetSize, error) {
	if opts.Get == nil {
		return nil, errors.New("kube: invalid FleetSizeOptions: option Get is required")
	}
	if opts.delay == nil {
		opts.delay = func(max time.Duration) time.Duration { return rand.N(max) }
	}
	m := &FleetSize{opts: opts, start: time.Now(), sem: make(chan struct{}, 1)}
	m.first = opts.delay(FleetSizeReadWindow)
	m.found = m.remembered()
	m.sweep()
	return m, nil
}

// Size answers PodsOptions.FleetSize and ObservabilityOptions.FleetSize: the
// remembered size at once, or one read, at its point of FleetSizeReadWindow
// (remembered when it succeeds). Every later call gets the same answer, an
// error too; a call whose ctx ends first returns ctx's error and leaves the
// read to the next call.
func (m *FleetSize) Size(ctx context.Context) (int, error) {
	if m.found > 0 {
		return m.found, nil
	}
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-m.sem }()
	if m.done {
		return m.n, m.err
	}
	if wait := time.Until(m.start.Add(m.first)); wait > 0 && !sleepCtx(ctx, wait) {
		return 0, ctx.Err()
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	gctx, cancel := context.WithTimeout(ctx, fleetSizeTimeout)
	n, err := m.opts.Get(gctx)
	cancel()
	if err != nil && ctx.Err() != nil {
		return 0, ctx.Err() // the caller gave up: not the answer
	}
	m.n, m.err, m.done = n, err, true
	if err == nil {
		m.remember(n)
	}
	return n, err
}

// Run reads the size again while the driver runs, for the next start: a
// start that found it remembered, at a random point of its window (as the
// fleet's lists); then every FleetSizeRefresh (jittered). It returns nil
// when ctx ends.
func (m *FleetSize) Run(ctx context.Context) error {
	next := jitter(FleetSizeRefresh)
	if m.found > 0 {
		next = m.opts.delay(FleetStartJitter(m.found))
	}
	for sleepCtx(ctx, next) {
		gctx, cancel := context.WithTimeout(ctx, fleetSizeTimeout)
		if n, err := m.opts.Get(gctx); err == nil {
			m.remember(n)
		}
		cancel()
		next = jitter(FleetSizeRefresh)
	}
	return nil
}

// remembered is the size in Path, 0 when there is none (or not a positive
// number).
func (m *FleetSize) remembered() int {
	if m.opts.Path == "" {
		return 0
	}
	b, err := os.ReadFile(m.opts.Path)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// staleTemp is the age from which a temporary file beside Path is a
// leftover: one written is renamed within microseconds, unless its process
// died in between (a kill, the node's reboot).
const staleTemp = time.Minute

// sweep removes the temporary files beside Path that remember left when its
// process died between writing and renaming; a driver of a rollout's surge
// still writing one of its own (younger than staleTemp) keeps it.
func (m *FleetSize) sweep() {
	if m.opts.Path == "" {
		return
	}
	tmp, _ := filepath.Glob(m.opts.Path + ".tmp-*")
	for _, p := range tmp {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && time.Since(fi.ModTime()) > staleTemp {
			_ = os.Remove(p)
		}
	}
}

// remember writes n to Path, through a temporary file of its own and a
// rename (two drivers on one state directory, a rollout's surge, cannot
// interleave); a failure leaves the next start to read the size again.
func (m *FleetSize) remember(n int) {
	if m.opts.Path == "" {
		return
	}
	f, err := os.CreateTemp(filepath.Dir(m.opts.Path), filepath.Base(m.opts.Path)+".tmp-*")
	if err != nil {
		return
	}
	_, werr := f.WriteString(strconv.Itoa(n) + "\n")
	if cerr := f.Close(); werr != nil || cerr != nil || os.Rename(f.Name(), m.opts.Path) != nil {
		_ = os.Remove(f.Name())
	}
}
