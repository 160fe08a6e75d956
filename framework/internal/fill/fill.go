package fill

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// Mounter is what Filler uses of the mounter (mount.Interface): the
// directory published at a target, opened beneath the kubelet root for the
// framework's own writes, and the read-only flag of its mount.
type Mounter interface {
	OpenTarget(root, target string) (*os.Root, error)
	SetReadOnly(root, target string, readOnly bool) error
}

// Config configures a Filler.
type Config struct {
	// KubeletRootDir is Options.Node.KubeletRootDir: targets are opened
	// beneath it.
	KubeletRootDir string
	// ContentTimeout is Options.Volumes.ContentTimeout, the bound of one
	// content provider's answer.
	ContentTimeout time.Duration
	// Windows selects the Windows rules: no fsGroup.
	Windows   bool
	Providers Providers
	Mounter   Mounter
	// Content, Refresh and Held are the lanes' (internal/lanes): the content
	// budget, the refreshes in flight and the content capacity, by party
	// (Providers.Party).
	Content *lanes.Budget
	Refresh *admission.Pool
	Held    *lanes.Held
	// Refreshed reports the end of each refresh of a live volume (Refresh),
	// err nil when it succeeded: the lifecycle counts it and posts a failure
	// to the pod's events.
	Refreshed func(v *api.Volume, err error)
	// PodCgroups, when set, finds the memory cgroup of a volume's pod, and
	// a writer there writes the content of memory-backed volumes
	// (ChargePod); nil is ChargeVolumeSize (OpenCharging).
	PodCgroups PodCgroups
	// PodCgroupWait bounds the wait for a pod's cgroup (the kubelet may
	// publish before it made it). Default DefaultPodCgroupWait.
	PodCgroupWait time.Duration
	// SaveHeld records, durably, that v's content holds n bytes of node
	// memory (store.Record.ContentHeld): Refresh calls it once a write is
	// admitted, before it writes (with the old and the new content's
	// charge), and once it is over, when what the content holds changed. A
	// failure before the write stops it. Fill does not call it: its caller
	// saves the record after it, with Held.Of.
	SaveHeld func(ctx context.Context, v *api.Volume, n int64) error
}

// Filler gives a mounted volume to the pod's fsGroup and writes its content,
// on publish (Fill) and on a refresh of a live volume (Refresh). The caller
// holds the volume's lock.
type Filler struct {
	cfg Config
}

// New returns the Filler of cfg.
func New(cfg Config) *Filler { return &Filler{cfg: cfg} }

// Provides reports whether backend's volumes have content (Providers.For).
func (f *Filler) Provides(backend string) bool { return f.cfg.Providers.For(backend) != nil }

// Any reports whether any volume of this driver may have content
// (Providers.Any).
func (f *Filler) Any() bool { return f.cfg.Providers.Any() }

// Fills reports whether Fill writes into v.
func (f *Filler) Fills(v *api.Volume) bool {
	return (v.FSGroup != nil && !f.cfg.Windows) || f.cfg.Providers.For(v.Backend) != nil
}

// Fill gives a mounted volume to the pod's fsGroup and writes its content.
// Both steps are idempotent.
func (f *Filler) Fill(ctx context.Context, v *api.Volume) error {
	if v.FSGroup != nil && !f.cfg.Windows {
		if err := f.applyFSGroup(v.TargetPath, int(*v.FSGroup)); err != nil {
			return fmt.Errorf("applying fsGroup %d: %w", *v.FSGroup, err)
		}
	}
	if f.cfg.Providers.For(v.Backend) != nil {
		files, release, err := f.content(ctx, v)
		if err != nil {
			return err
		}
		defer release()
		return f.writeContent(ctx, v, files, false)
	}
	return nil
}

// applyFSGroup gives the volume's root to the pod's fsGroup the way the kubelet
// does for volumes it owns: group ownership, group read/write/search, and setgid
// so new files inherit the group. The driver advertises VOLUME_MOUNT_GROUP, so the
// kubelet leaves this to the driver and never walks the volume itself.
func (f *Filler) applyFSGroup(target string, gid int) error {
	r, err := f.cfg.Mounter.OpenTarget(f.cfg.KubeletRootDir, target)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Lchown(".", -1, gid); err != nil {
		return err
	}
	fi, err := r.Lstat(".")
	if err != nil {
		return err
	}
	return r.Chmod(".", fi.Mode().Perm()|0o070|fi.Mode()&fs.ModeSticky|fs.ModeSetgid)
}

// Refresh asks the content provider for v's files and swaps them in,
// making a read-only volume writable only for the swap, within the refresh
// lane of v's content party. The caller holds the volume's lock. On any
// error the previous content stays in place. Config.Refreshed hears of it
// either way.
func (f *Filler) Refresh(ctx context.Context, v *api.Volume) (err error) {
	defer func() { f.cfg.Refreshed(v, err) }()
	slot, err := f.cfg.Refresh.Acquire(ctx, f.cfg.Providers.Party(v.Backend), 1)
	if err != nil {
		return err
	}
	defer slot.Release()
	files, release, err := f.content(ctx, v)
	if err != nil {
		return err
	}
	defer release()
	if v.ReadOnly {
		if err := f.cfg.Mounter.SetReadOnly(f.cfg.KubeletRootDir, v.TargetPath, false); err != nil {
			return fmt.Errorf("making volume writable for the refresh: %w", err)
		}
		defer func() {
			if rerr := f.cfg.Mounter.SetReadOnly(f.cfg.KubeletRootDir, v.TargetPath, true); rerr != nil {
				klog.FromContext(ctx).Error(rerr, "Making volume read-only again after a refresh")
			}
		}()
	}
	return f.writeContent(ctx, v, files, true)
}

// content calls the content provider of v's backend (Providers.For) within
// ContentTimeout and, for a provider whose answers are bounded, within the
// ContentBytesInFlight budget: its bound is reserved before the call, and
// release returns it once the caller has written the files (until then they
// are in memory). release is never nil.
func (f *Filler) content(ctx context.Context, v *api.Volume) (files map[string]api.File, release func(), err error) {
	release = func() {}
	cp := f.cfg.Providers.For(v.Backend)
	if cp == nil {
		return nil, release, fmt.Errorf("backend %s has no content provider", v.Backend)
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.ContentTimeout)
	defer cancel()
	if cb, ok := cp.(ContentBounder); ok {
		if release, err = f.cfg.Content.Reserve(ctx, f.cfg.Providers.Party(v.Backend), cb.ContentLimits().MaxBytes); err != nil {
			return nil, func() {}, err
		}
	}
	files, err = cp.Content(ctx, v)
	if err != nil {
		release()
		return nil, func() {}, fmt.Errorf("content provider: %w", err)
	}
	return files, release, nil
}

// writeContent swaps files into the volume atomically, owned by the fsGroup,
// under the limits of a provider that declares them (those its answer was
// checked against), else the content package's defaults. It stops when ctx
// is done, the previous content in place.
//
// In a memory-backed volume the pages of the files are paid for as
// Config.PodCgroups says (Charging): by the pod (writeAsPod), or by the
// driver within the volume's whole size, reserved from the content
// capacity (writeReserved). Neither reads the volume to count it, which
// the pod may write (DESIGN 4g).
func (f *Filler) writeContent(ctx context.Context, v *api.Volume, files map[string]api.File, save bool) error {
	var opts content.Options
	if !f.cfg.Windows {
		opts.FSGroup = v.FSGroup
	}
	if cb, ok := f.cfg.Providers.For(v.Backend).(ContentBounder); ok {
		opts.Limits = cb.ContentLimits()
	}
	r, err := f.cfg.Mounter.OpenTarget(f.cfg.KubeletRootDir, v.TargetPath)
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	defer r.Close()
	inMemory, err := stats.MemoryBacked(r)
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	switch {
	case !inMemory:
		err = content.WriteRoot(ctx, r, files, opts)
	case f.cfg.PodCgroups != nil:
		err = f.writeAsPod(ctx, v, r, files, opts, save)
	default:
		err = f.writeReserved(ctx, v, r, files, opts, save)
	}
	if errors.Is(err, content.ErrNoSpace) && v.Size > 0 {
		return fmt.Errorf("%w; the volume's size is %s: ask for a larger \"size\" in the pod's volumeAttributes", err, words.Bytes(v.Size))
	}
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	return nil
}
