package memstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/ephemera-csi/ephemera/framework/store"
)

// errClosed is returned by every call after Close.
var errClosed = errors.New("memstore: store is closed")

// Store is an in-memory [store.Store]. The zero value is not usable; call [New].
type Store struct {
	id      string
	mu      sync.RWMutex
	records map[string]*store.Record
	closed  bool
}

var _ store.Store = (*Store)(nil)

// New returns an empty store with a new random ID (32 hex digits, as boltstore's).
func New() *Store {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return NewWithID(hex.EncodeToString(b))
}

// NewWithID returns an empty store whose [Store.ID] is id, for tests that need a
// known identity (for example a store "reopened" after a restart).
func NewWithID(id string) *Store {
	return &Store{id: id, records: make(map[string]*store.Record)}
}

// ID returns the store's identity, like boltstore's Store.ID: fixed for the
// store's life, different for every New.
func (s *Store) ID() string { return s.id }

// Get implements [store.Store]. The result is a copy.
func (s *Store) Get(ctx context.Context, id string) (*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, errClosed
	}
	r, ok := s.records[id]
	if !ok {
		return nil, fmt.Errorf("memstore: get: %w: %q", store.ErrNotFound, id)
	}
	return r.Clone(), nil
}

// Put implements [store.Store]. It stores a copy of r after setting r.Version.
func (s *Store) Put(ctx context.Context, r *store.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r == nil {
		return errors.New("memstore: put: nil record")
	}
	if r.VolumeID == "" {
		return errors.New("memstore: put: empty volume ID")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	r.Version = store.RecordVersion
	s.records[r.VolumeID] = r.Clone()
	return nil
}

// Delete implements [store.Store]. Deleting an unknown ID is not an error.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	delete(s.records, id)
	return nil
}

// List implements [store.Store]. The records are copies, ordered by volume ID.
func (s *Store) List(ctx context.Context) ([]*store.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, errClosed
	}
	ids := slices.Sorted(maps.Keys(s.records))
	out := make([]*store.Record, 0, len(ids))
	for _, id := range ids {
		out = append(out, s.records[id].Clone())
	}
	return out, nil
}

// Close implements [store.Store]. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.records = nil
	return nil
}
