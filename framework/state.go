package framework

import (
	"context"
	"errors"

	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// What the driver does at startup with a damaged state file
// (Options.State.Recovery).
const (
	// StateRecoveryRebuild keeps what can still be read of the damaged file,
	// moves it aside (never deletes it) and rebuilds the state from the node.
	StateRecoveryRebuild = "rebuild"
	// StateRecoveryRefuse fails the startup with an error naming the file, for
	// an operator who wants to look first (RebuildState, or `state rebuild` in
	// the scratch driver, does the recovery then).
	StateRecoveryRefuse = "refuse"
)

// RebuildState is the offline recovery of a node's state, for an operator
// (the scratch driver's `state rebuild`): it moves the state file aside when
// there is one (it is never deleted), starts a new one with what Salvage can
// read of it, and runs the startup reconcile, which adopts every volume the
// node shows (mounts at targets, the kubelet's vol_data.json, the backends'
// inventories). It must not run while a driver serves this state (the file
// lock makes it fail). It returns the path the old file was moved to ("" when
// there was none).
func (d *Driver) RebuildState(ctx context.Context) (aside string, err error) {
	if d.running.Load() {
		return "", errors.New("the driver is running; RebuildState is for a stopped driver")
	}
	return d.daemon.RebuildState(ctx)
}

var _ store.Identifier = (*boltstore.Store)(nil)

// Records returns the driver's volume records (copies), ordered by volume ID:
// what it holds on this node, for tools and tests. It needs a driver that
// serves (Ready).
func (d *Driver) Records(ctx context.Context) ([]*store.Record, error) {
	if !d.ready.Load() {
		return nil, errors.New("the driver is not running")
	}
	return d.engine.Store().List(ctx)
}
