package drivertest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// Restart models a kubelet restart. The actual state is forgotten and rebuilt
// from disk: every <root>/pods/*/volumes/kubernetes.io~csi/*/vol_data.json of
// this driver becomes an uncertain, reconstructed volume. Then, as the
// reconciler does, each volume of a desired pod whose spec still lists it is
// published again with the pod's original InlineVolume (the full Publish
// sequence), and every other one is unpublished with the handle from
// vol_data.json; a pod that is not desired and whose volumes were all
// unpublished has its empty directories removed as in DeletePod (best
// effort). The simulator has no retry loop for publishes: desired volumes
// that are not on disk (never published, or failed finally) are not published
// by Restart. Unpublishes are retried as [Kubelet.Unpublish]'s are.
// Operations run one after another; their errors are joined.
func (k *Kubelet) Restart(ctx context.Context) error {
	found, err := k.scanVolumes()

	k.mu.Lock()
	k.actual = map[kubeletVolKey]*kubeletVol{}
	type job struct {
		key     kubeletVolKey
		publish bool
		pod     Pod
		vol     InlineVolume
	}
	var jobs []job
	for _, f := range found {
		k.actual[f.key] = &kubeletVol{state: StateUncertain, reconstructed: true, handle: f.handle}
		j := job{key: f.key}
		if p := k.pods[f.key.uid]; p != nil && !p.deleted {
			if vol, ok := p.volumes[f.key.name]; ok {
				j.publish, j.pod, j.vol = true, clonePod(&p.pod), cloneVolume(vol)
			}
		}
		jobs = append(jobs, j)
	}
	k.mu.Unlock()

	errs := []error{err}
	orphans := map[string]bool{}
	for _, j := range jobs {
		if j.publish {
			if err := k.setUp(ctx, j.pod, j.vol); err != nil {
				errs = append(errs, fmt.Errorf("republishing %s/%s: %w", j.key.uid, j.key.name, err))
			}
			continue
		}
		if _, ok := orphans[j.key.uid]; !ok {
			orphans[j.key.uid] = true
		}
		if err := k.tearDown(ctx, j.key.uid, j.key.name); err != nil {
			orphans[j.key.uid] = false
			errs = append(errs, fmt.Errorf("unpublishing %s/%s: %w", j.key.uid, j.key.name, err))
		}
	}
	for uid, clean := range orphans {
		k.mu.Lock()
		p := k.pods[uid]
		desired := p != nil && !p.deleted
		k.mu.Unlock()
		if !clean || desired {
			continue
		}
		// Best effort, like the kubelet's periodic orphan cleanup: directories
		// that are not empty (another driver's volumes) are left.
		if err := k.cleanupPodDirs(uid); err != nil {
			continue
		}
		k.mu.Lock()
		if p := k.pods[uid]; p != nil && p.deleted {
			delete(k.pods, uid)
		}
		k.mu.Unlock()
	}
	return errors.Join(errs...)
}

type foundVolume struct {
	key    kubeletVolKey
	handle string
}

// scanVolumes reads every vol_data.json of this driver under <root>/pods.
func (k *Kubelet) scanVolumes() ([]foundVolume, error) {
	pattern := filepath.Join(k.root, volume.PodsDir, "*", volume.VolumesDir, volume.PluginDir, "*", volume.VolDataFile)
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	var (
		out  []foundVolume
		errs []error
	)
	for _, f := range files {
		volDir := filepath.Dir(f)
		data, err := readVolData(volDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("reconstructing %s: %w", volDir, err))
			continue
		}
		if data[volDataDriverName] != k.driverName {
			continue
		}
		uid := filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(volDir))))
		out = append(out, foundVolume{
			key:    kubeletVolKey{uid: uid, name: filepath.Base(volDir)},
			handle: data[volDataVolumeHandle],
		})
	}
	return out, errors.Join(errs...)
}
