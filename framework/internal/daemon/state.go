package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// damagedSuffix is added, with a timestamp, to a damaged state file moved aside.
const damagedSuffix = ".damaged-"

// openState opens the bbolt state in StateDir. A damaged file is recovered
// according to Options.State.Recovery; records that did not decode were
// quarantined by the store and are rebuilt from the node by the reconcile.
func (d *Daemon) openState(log klog.Logger) (*boltstore.Store, error) {
	if err := os.MkdirAll(d.cfg.Node.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	path := filepath.Join(d.cfg.Node.StateDir, d.cfg.Node.StateFile)
	opts := boltstore.Options{Timeout: d.cfg.State.LockTimeout, Writer: d.cfg.DriverName + " " + d.cfg.Node.Version}
	st, err := boltstore.Open(path, opts)
	if errors.Is(err, boltstore.ErrCorrupt) {
		if d.cfg.State.RefuseDamaged {
			return nil, fmt.Errorf("opening driver state: %w; the driver runs with StateRecovery %q: inspect it, then move it aside or rebuild (docs/operations.md, 'Damaged state')", err, d.cfg.State.Recovery)
		}
		log.Error(err, "The state file is damaged; keeping what can be read, moving it aside and rebuilding the state from the node")
		st, _, err = d.recoverState(log, path, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("opening driver state: %w", err)
	}
	if q := st.Quarantined(); len(q) > 0 {
		for range q {
			d.metrics.Reconciled(metrics.ReconcileQuarantined)
		}
		log.Error(nil, "Records of the state file could not be read; they are kept in its quarantine bucket and the volumes are rebuilt from the node", logkeys.Count, len(q), logkeys.VolumeIDs, q)
	}
	return st, nil
}

// recoverState moves the damaged file at path aside and opens a new store
// there, holding the records Salvage could still read of the damaged one
// (attribute hashes and pod names the node cannot tell). The reconcile that
// follows rebuilds the rest.
func (d *Daemon) recoverState(log klog.Logger, path string, opts boltstore.Options) (st *boltstore.Store, aside string, err error) {
	salvaged, serr := boltstore.Salvage(path)
	if aside, err = moveAside(path); err != nil {
		return nil, "", err
	}
	d.metrics.StateRecovered()
	if st, err = boltstore.Open(path, opts); err != nil {
		return nil, aside, err
	}
	for _, rec := range salvaged {
		if err := st.Put(context.Background(), rec); err != nil {
			st.Close()
			return nil, aside, fmt.Errorf("saving a salvaged record: %w", err)
		}
	}
	log.Info("Moved the state file aside and started a new one; the reconcile rebuilds what it lacks from the node",
		logkeys.MovedTo, aside, logkeys.SalvagedRecords, len(salvaged), logkeys.SalvageError, errString(serr))
	return st, aside, nil
}

// moveAside renames the file at path to path.damaged-<UTC time> (never
// overwriting anything) and syncs the directory.
func moveAside(path string) (string, error) {
	base := path + damagedSuffix + time.Now().UTC().Format("20060102T150405Z")
	aside := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(aside); errors.Is(err, os.ErrNotExist) {
			break
		}
		aside = fmt.Sprintf("%s.%d", base, i)
	}
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("moving the damaged state file aside: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return aside, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// RebuildState is framework.Driver.RebuildState of a stopped driver.
func (d *Daemon) RebuildState(ctx context.Context) (aside string, err error) {
	if err := os.MkdirAll(d.cfg.Node.StateDir, 0o700); err != nil {
		return "", fmt.Errorf("creating state dir: %w", err)
	}
	log := d.cfg.Observability.Logger.WithValues(logkeys.Driver, d.cfg.DriverName)
	path := filepath.Join(d.cfg.Node.StateDir, d.cfg.Node.StateFile)
	opts := boltstore.Options{Timeout: d.cfg.State.LockTimeout, Writer: d.cfg.DriverName + " " + d.cfg.Node.Version}
	var st *boltstore.Store
	if _, err := os.Lstat(path); err == nil {
		// Take the lock first, so that a running driver makes this fail.
		old, oerr := boltstore.Open(path, opts)
		if errors.Is(oerr, boltstore.ErrLocked) {
			return "", oerr
		}
		if oerr == nil {
			old.Close()
		}
		if st, aside, err = d.recoverState(log, path, opts); err != nil {
			return aside, err
		}
	} else if st, err = boltstore.Open(path, opts); err != nil {
		return "", err
	}
	defer st.Close()
	prev := d.engine.SetStore(st)
	defer d.engine.SetStore(prev)
	return aside, d.engine.Reconcile(ctx)
}
