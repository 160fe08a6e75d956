package fill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/podcgroup"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// Charging is how the pages of the content the driver writes into
// memory-backed volumes are paid for (DESIGN 4g).
type Charging string

const (
	// ChargePod: a writer in the pod's own memory cgroup writes the files
	// (internal/podcgroup), so their pages are charged to the pod, against
	// its limit, whatever it keeps alive (links, open descriptors, renames),
	// as a memory-backed emptyDir's are. The content capacity does not
	// count them.
	ChargePod Charging = "pod-cgroup"
	// ChargeVolumeSize is the fallback where the pod's cgroup cannot be
	// found (no pod cgroups: Windows, a kubelet with cgroupsPerQOS: false;
	// PodCgroupOptions.Mode "off"): the driver writes the files, and each
	// memory-backed volume with content is reserved against the content
	// capacity at what the kernel lets its filesystem hold (its size= and
	// nr_inodes, read with statfs), once, until the volume is gone. What a
	// pod keeps alive is then bounded by the kernel: it fills the pod's own
	// volume, whose next refreshes fail (and say so), nobody else's.
	ChargeVolumeSize Charging = "volume-size"
)

// Modes of PodCgroupConfig.Mode.
const (
	PodCgroupsAuto     = "auto"
	PodCgroupsOff      = "off"
	PodCgroupsRequired = "required"
)

// PodCgroupConfig is Options.Volumes.PodCgroups: where the kubelet keeps the
// pods' cgroups, as the driver sees them.
type PodCgroupConfig struct {
	// Mode is PodCgroupsAuto (charge pods where the node has pod cgroups,
	// else the fallback), PodCgroupsOff (always the fallback) or
	// PodCgroupsRequired (refuse to start without pod cgroups).
	Mode string
	// Mount, Root and Driver are podcgroup.Hierarchy's; Driver "" or
	// "auto" finds the kubelet's cgroup driver from the tree (its kubepods
	// cgroup, cgroupfs's or systemd's name for it).
	Mount, Root, Driver string
	// Wait bounds how long a write waits for its pod's cgroup to appear.
	Wait time.Duration
}

// PodCgroups finds the memory cgroup of a pod (podcgroup.Tree).
type PodCgroups interface {
	// Wait returns the cgroup of the pod of uid once it exists, within ctx.
	Wait(ctx context.Context, uid string) (PodCgroup, error)
}

// PodCgroup writes files from a process in a pod's memory cgroup
// (*podcgroup.Cgroup).
type PodCgroup interface {
	Write(ctx context.Context, dir *os.File, files map[string]podcgroup.File, opts podcgroup.WriteOptions) (podcgroup.Result, error)
}

// tree is a podcgroup.Tree as PodCgroups.
type tree struct{ t *podcgroup.Tree }

func (t tree) Wait(ctx context.Context, uid string) (PodCgroup, error) {
	c, err := t.t.Wait(ctx, uid)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// OpenCharging finds how this node's content is charged (Charging), and
// the pods' cgroups when they are. why says what decided it, for the log
// line at start. Only PodCgroupsRequired fails, where there are no pod
// cgroups to charge.
func OpenCharging(c PodCgroupConfig) (pods PodCgroups, mode Charging, why string, err error) {
	switch c.Mode {
	case PodCgroupsOff:
		return nil, ChargeVolumeSize, "pod cgroups are off (--pod-cgroups=off)", nil
	case PodCgroupsAuto, "", PodCgroupsRequired:
	default:
		return nil, "", "", fmt.Errorf("pod cgroups mode %q: want %q, %q or %q", c.Mode, PodCgroupsAuto, PodCgroupsOff, PodCgroupsRequired)
	}
	t, why, err := openTree(c)
	switch {
	case err != nil:
		return nil, "", "", err
	case t != nil:
		return tree{t}, ChargePod, why, nil
	case c.Mode == PodCgroupsRequired:
		return nil, "", "", fmt.Errorf("pod cgroups are required (--pod-cgroups=required) and %s", why)
	}
	return nil, ChargeVolumeSize, why, nil
}

// openTree opens the hierarchy of c and finds its kubepods cgroup, with
// c.Driver or, when it is "" or "auto", with the first driver whose
// kubepods exists (cgroupfs, then systemd). It returns nil and why where
// there are no pod cgroups; an error only for a configuration that cannot
// be right.
func openTree(c PodCgroupConfig) (*podcgroup.Tree, string, error) {
	drivers := []podcgroup.Driver{podcgroup.Driver(c.Driver)}
	if c.Driver == "" || c.Driver == "auto" {
		drivers = []podcgroup.Driver{podcgroup.Cgroupfs, podcgroup.Systemd}
	}
	var looked []string
	for _, d := range drivers {
		t, err := podcgroup.Open(podcgroup.Hierarchy{Mount: c.Mount, Root: c.Root, Driver: d})
		if errors.Is(err, podcgroup.ErrUnsupported) {
			return nil, err.Error(), nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("pod cgroups: %w", err)
		}
		fi, err := os.Stat(t.Kubepods())
		if err == nil && fi.IsDir() {
			h := t.Hierarchy()
			return t, fmt.Sprintf("the kubelet's pod cgroups are at %s (cgroup %v, driver %s, cgroup root %s)", t.Kubepods(), h.Version, h.Driver, h.Root), nil
		}
		looked = append(looked, t.Kubepods())
	}
	return nil, fmt.Sprintf("the node has no pod cgroups where the kubelet would make them (looked for %v: a kubelet with cgroupsPerQOS: false, or set --kubelet-cgroup-root, --kubelet-cgroup-driver and --pod-cgroup-mount to the kubelet's and the host's)", looked), nil
}

// writeAsPod writes files into v's volume r from a writer in the memory
// cgroup of v's pod (ChargePod), waiting for the cgroup up to
// Config.PodCgroupWait. The volume holds nothing the content capacity
// counts afterwards: what an earlier run of the driver counted for it
// (ChargeVolumeSize) is released once the new files replaced the old.
func (f *Filler) writeAsPod(ctx context.Context, v *api.Volume, r *os.Root, files map[string]api.File, opts content.Options, save bool) error {
	wait := f.cfg.PodCgroupWait
	if wait <= 0 {
		wait = DefaultPodCgroupWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	cg, err := f.cfg.PodCgroups.Wait(wctx, v.Pod.UID)
	cancel()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("waiting for the memory cgroup of pod %s: %w", v.Pod.UID, cerr)
		}
		if errors.Is(err, podcgroup.ErrBadUID) {
			return errkind.Invalidf("the content of this volume is charged to its pod's memory cgroup, found by the pod's UID, and %v: the CSIDriver object needs podInfoOnMount: true", err)
		}
		if errors.Is(err, podcgroup.ErrNotFound) || errors.Is(err, context.DeadlineExceeded) {
			return errkind.Transient(fmt.Errorf("the content of this volume is charged to its pod's memory cgroup, which the kubelet had not made after %s (it makes it before the pod's containers start; the kubelet retries): %w", wait, err))
		}
		return errkind.Errorf(errkind.ErrInternal, "finding the memory cgroup of pod %s: %v", v.Pod.UID, err)
	}
	wrote := false // the write swapped (or tried to swap) new files in
	opts.WriteFiles = func(ctx context.Context, dir *os.File, files map[string]api.File, gid int) error {
		wrote = true
		pf := make(map[string]podcgroup.File, len(files))
		var n int64
		for name, file := range files {
			pf[name] = podcgroup.File{Data: file.Data, Mode: file.Mode}
			n += int64(len(file.Data))
		}
		wo := podcgroup.WriteOptions{DirMode: 0o755, Limits: podcgroup.Limits{MaxFiles: len(pf), MaxBytes: n}}
		if gid >= 0 {
			g := int64(gid)
			wo.GID = &g
		}
		res, err := cg.Write(ctx, dir, pf, wo)
		if res.LeafLeft != nil {
			klog.FromContext(ctx).V(2).Info("Left the writer's empty cgroup behind (it goes with the pod's)", logkeys.Leaf, res.Leaf, logkeys.Err, res.LeafLeft)
		}
		switch {
		case errors.Is(err, podcgroup.ErrNoSpace):
			return content.ErrNoSpace
		case errors.Is(err, podcgroup.ErrPodOutOfMemory):
			return errkind.Errorf(api.ErrResourceExhausted, "the pod's memory limit cannot hold its content (%d files, %s of data), which is charged to the pod as a memory-backed emptyDir is, with what it keeps of earlier content: raise the pod's memory limit: %v", len(pf), words.Bytes(n), err)
		}
		return err
	}
	err = content.WriteRoot(ctx, r, files, opts)
	if wrote && f.cfg.Held.Holds(v.ID) && (err == nil || errors.Is(err, content.ErrReplaced)) {
		f.cfg.Held.Release(v.ID)
		if save {
			if serr := f.cfg.SaveHeld(context.WithoutCancel(ctx), v, 0); serr != nil {
				klog.FromContext(ctx).Error(serr, "Recording that the content is charged to the pod")
			}
		}
	}
	return err
}

// DefaultPodCgroupWait is Config.PodCgroupWait's default.
const DefaultPodCgroupWait = 10 * time.Second

// writeReserved writes files into v's memory-backed volume r itself
// (ChargeVolumeSize): the first write that swaps files in reserves from the
// content capacity what the kernel lets the volume's filesystem hold (its
// size and inodes, as content.InodeCharge charges them), and the volume
// keeps it until it is gone (Held.Release at teardown), whatever the pod
// keeps alive of its content: no write can make the driver pay for more.
// A filesystem without a size bound (ramfs, a tmpfs without size=) is
// refused. With save (a refresh), the record of the volume says what it
// holds (Config.SaveHeld) before the write.
func (f *Filler) writeReserved(ctx context.Context, v *api.Volume, r *os.Root, files map[string]api.File, opts content.Options, save bool) error {
	held := f.cfg.Held
	party := f.cfg.Providers.Party(v.Backend)
	_, size, inodes, err := stats.MemoryBound(r)
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	if size <= 0 {
		return errkind.Invalidf("the volume's memory-backed filesystem has no size limit, and on this node the content the driver writes into it is charged to the driver (%s charging: no pod cgroups) without bound; retrying does not help: give the volume a size", ChargeVolumeSize)
	}
	bound := size + inodes*content.InodeCharge
	old := held.Of(v.ID)
	var pending *admission.Grant
	admitted := false
	if old < bound {
		what := fmt.Sprintf("the content of volume %s may take %s of node memory in its tmpfs (its size, %s, and %d inodes at %s each: on this node, without pod cgroups, the driver pays for what it writes there)",
			v.ID, words.Bytes(bound), words.Bytes(size), inodes, words.Bytes(content.InodeCharge))
		opts.Admit = func() (err error) {
			if pending, err = held.Reserve(v.ID, party, bound-old, what); err != nil {
				return err
			}
			if save {
				if err := f.cfg.SaveHeld(ctx, v, bound); err != nil {
					pending.Release()
					return errkind.Transient(fmt.Errorf("recording the content's charge before writing it: %w", err))
				}
			}
			admitted = true
			return nil
		}
	}
	err = content.WriteRoot(ctx, r, files, opts)
	switch {
	case admitted && errors.Is(err, content.ErrRolledBack):
		pending.Release()
		if save {
			if serr := f.cfg.SaveHeld(context.WithoutCancel(ctx), v, old); serr != nil {
				// The record says more than is held until the next write:
				// logged, the count in memory is right.
				klog.FromContext(ctx).Error(serr, "Recording the content's charge after a write that wrote nothing")
			}
		}
	case admitted:
		held.Add(v.ID, pending, bound-old)
	case err == nil && len(files) > 0 && old < bound:
		// Nothing to swap: the files are the content already (an earlier
		// run wrote them, and its record did not count them at the bound):
		// the rest of the bound where the capacity has room, else the count
		// stays what it was until a write that swaps is admitted.
		g, rerr := held.Reserve(v.ID, party, bound-old, "")
		if rerr != nil {
			break
		}
		held.Add(v.ID, g, bound-old)
		if save {
			if serr := f.cfg.SaveHeld(context.WithoutCancel(ctx), v, bound); serr != nil {
				klog.FromContext(ctx).Error(serr, "Recording the content's charge")
			}
		}
	}
	return err
}
