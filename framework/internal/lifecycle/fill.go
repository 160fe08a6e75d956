package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// This file holds what fills a volume, as the lifecycle calls it
// (lifecycle.go): the pod's fsGroup, the content provider's files (within
// ContentTimeout and the ContentBytesInFlight budget) written atomically,
// and the refresh of a live volume's content. It also names who approves a
// first publish (authorizers).

// fills reports whether fill writes into v.
func (d *Engine) fills(v *api.Volume) bool {
	return (v.FSGroup != nil && !isWindows) || d.contentFor(v.Backend) != nil
}

// fill gives a mounted volume to the pod's fsGroup and writes its content.
// Both steps are idempotent.
func (d *Engine) fill(ctx context.Context, v *api.Volume) error {
	if v.FSGroup != nil && !isWindows {
		if err := d.applyFSGroup(v.TargetPath, int(*v.FSGroup)); err != nil {
			return fmt.Errorf("applying fsGroup %d: %w", *v.FSGroup, err)
		}
	}
	if d.contentFor(v.Backend) != nil {
		files, release, err := d.content(ctx, v)
		if err != nil {
			return err
		}
		defer release()
		return d.writeContent(ctx, v, files)
	}
	return nil
}

// applyFSGroup gives the volume's root to the pod's fsGroup the way the kubelet
// does for volumes it owns: group ownership, group read/write/search, and setgid
// so new files inherit the group. The driver advertises VOLUME_MOUNT_GROUP, so the
// kubelet leaves this to the driver and never walks the volume itself.
func (d *Engine) applyFSGroup(target string, gid int) error {
	r, err := d.mounter.OpenTarget(d.cfg.Node.KubeletRootDir, target)
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

// refreshContent asks the content provider for v's files and swaps them in,
// making a read-only volume writable only for the swap. The caller holds the
// volume's lock. On any error the previous content stays in place.
func (d *Engine) refreshContent(ctx context.Context, v *api.Volume) (err error) {
	defer func() { d.refreshed(v, err) }()
	slot, err := d.lanes.Refresh.Acquire(ctx, d.contentParty(v.Backend), 1)
	if err != nil {
		return err
	}
	defer slot.Release()
	files, release, err := d.content(ctx, v)
	if err != nil {
		return err
	}
	defer release()
	if v.ReadOnly {
		if err := d.mounter.SetReadOnly(d.cfg.Node.KubeletRootDir, v.TargetPath, false); err != nil {
			return fmt.Errorf("making volume writable for the refresh: %w", err)
		}
		defer func() {
			if rerr := d.mounter.SetReadOnly(d.cfg.Node.KubeletRootDir, v.TargetPath, true); rerr != nil {
				klog.FromContext(ctx).Error(rerr, "Making volume read-only again after a refresh")
			}
		}()
	}
	return d.writeContent(ctx, v, files)
}

// content calls the content provider of v's backend (contentFor) within
// ContentTimeout and, for a provider whose answers are bounded, within the
// ContentBytesInFlight budget: its bound is reserved before the call, and
// release returns it once the caller has written the files (until then they
// are in memory). release is never nil.
func (d *Engine) content(ctx context.Context, v *api.Volume) (files map[string]api.File, release func(), err error) {
	release = func() {}
	cp := d.contentFor(v.Backend)
	if cp == nil {
		return nil, release, fmt.Errorf("backend %s has no content provider", v.Backend)
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Volumes.ContentTimeout)
	defer cancel()
	if cb, ok := cp.(ContentBounder); ok {
		if release, err = d.lanes.Content.Reserve(ctx, d.contentParty(v.Backend), cb.ContentLimits().MaxBytes); err != nil {
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
// is done, the previous content in place. In a memory-backed volume the new
// files' charge is reserved from the content capacity before they are
// written (heldContent), and replaces what the old ones held once they are.
func (d *Engine) writeContent(ctx context.Context, v *api.Volume, files map[string]api.File) error {
	var opts content.Options
	if !isWindows {
		opts.FSGroup = v.FSGroup
	}
	if cb, ok := d.contentFor(v.Backend).(ContentBounder); ok {
		opts.Limits = cb.ContentLimits()
	}
	r, err := d.mounter.OpenTarget(d.cfg.Node.KubeletRootDir, v.TargetPath)
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	defer r.Close()
	held := d.lanes.Held
	party := d.contentParty(v.Backend)
	inMemory, err := stats.MemoryBacked(r)
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	var charge int64
	var pending *admission.Grant
	if inMemory {
		charge = content.Charge(files, held.Page())
		opts.Admit = func() (err error) {
			pending, err = held.Reserve(v.ID, party, charge, len(files))
			return err
		}
	}
	err = content.WriteRoot(ctx, r, files, opts)
	switch {
	case !inMemory:
	case err == nil && (pending != nil || !held.Holds(v.ID)):
		held.Set(v.ID, pending, charge) // also without a bound: counted
	case err != nil && pending != nil:
		// Cut short after the reservation: count what is there now.
		pending.Release()
		if n, cerr := content.Charged(r, held.Page()); cerr == nil {
			held.Adopt(v.ID, party, n)
		}
	}
	if errors.Is(err, content.ErrNoSpace) && v.Size > 0 {
		return fmt.Errorf("%w; the volume's size is %s: ask for a larger \"size\" in the pod's volumeAttributes", err, words.Bytes(v.Size))
	}
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	return nil
}

// contentFor returns what fills the volumes of the named backend: the backend
// itself when it is a ContentProvider (a plugin that provides content),
// otherwise Options.Content; nil when neither.
func (d *Engine) contentFor(backend string) ContentProvider {
	if b, ok := d.cfg.Backends[backend]; ok {
		if cp := b.ContentProvider(); cp != nil {
			return cp
		}
	}
	return d.cfg.Content
}

// anyContent reports whether any volume of this driver may have content:
// Options.Content is set or a backend's type is a ContentProvider.
func (d *Engine) anyContent() bool {
	if d.cfg.Content != nil {
		return true
	}
	for _, b := range d.cfg.Backends {
		if _, ok := b.Unwrap().(ContentProvider); ok {
			return true
		}
	}
	return false
}
