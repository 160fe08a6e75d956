//go:build !linux

package loop

import (
	"context"
	"fmt"

	"github.com/ephemera-csi/ephemera/api"
)

// Create fails: loop devices are Linux-only.
func (b *Backend) Create(context.Context, *api.Volume) (api.Source, error) {
	return api.Source{}, fmt.Errorf("loop volumes: %w (use the dir backend)", api.ErrNotSupported)
}

// Delete has nothing to free: Create never provisions anything here.
func (b *Backend) Delete(context.Context, *api.Volume) error { return nil }

// List returns nothing.
func (b *Backend) List(context.Context) ([]string, error) { return nil, nil }

// Check fails like Create.
func (b *Backend) Check(context.Context, *api.Volume) error {
	return fmt.Errorf("loop volumes: %w", api.ErrNotSupported)
}
