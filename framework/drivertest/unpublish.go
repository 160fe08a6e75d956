package drivertest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// Unpublish runs the kubelet's TearDownAt for the volume: it reads the volume
// handle from vol_data.json (as NewUnmounter does), sends NodeUnpublishVolume
// with only volume_id and target_path (again on KubeletOptions.Retry's
// schedule while the answer is Aborted or Unavailable), then runs
// removeMountDir. If any step fails the volume stays tracked so that a retry
// (or Restart) unpublishes it again. The volume is no longer desired either way. A volume the kubelet does
// not consider mounted or uncertain gets no RPC.
func (k *Kubelet) Unpublish(ctx context.Context, pod *Pod, volName string) error {
	k.mu.Lock()
	if p := k.pods[pod.UID]; p != nil {
		delete(p.volumes, volName)
	}
	k.mu.Unlock()
	return k.tearDown(ctx, pod.UID, volName)
}

func (k *Kubelet) tearDown(ctx context.Context, uid, volName string) error {
	key := kubeletVolKey{uid, volName}
	unlock := k.lockVolume(key)
	defer unlock()

	k.mu.Lock()
	v := k.actual[key]
	k.mu.Unlock()
	if v == nil {
		return nil
	}

	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()

	target := k.targetPath(uid, volName)
	data, err := readVolData(filepath.Dir(target))
	if err != nil {
		return fmt.Errorf("drivertest: unmounter failed to load volume data of %s: %w", target, err)
	}
	handle := data[volDataVolumeHandle]
	req := &csi.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}
	k.mu.Lock()
	retry := k.retry
	k.mu.Unlock()
	if _, err := retry.retryWhile(ctx, func(ctx context.Context) error {
		return k.call(ctx, "NodeUnpublishVolume "+handle, func(c csi.NodeClient) error {
			_, err := c.NodeUnpublishVolume(ctx, req)
			return err
		})
	}, InProgress); err != nil {
		return err
	}
	if err := k.removeMountDir(target); err != nil {
		return err
	}
	k.mu.Lock()
	delete(k.actual, key)
	k.mu.Unlock()
	return nil
}

// DeletePod models deleting the pod while the kubelet runs: the pod leaves the
// desired state, every tracked (mounted or uncertain) volume of the pod is
// unpublished, each on a goroutine of its own as the kubelet's operation
// executor runs them, retried as [Kubelet.Unpublish] is (the errors are
// joined, in the volumes' name order), and when that succeeded the kubelet's
// orphaned-pod cleanup removes the empty directories
// volumes/kubernetes.io~csi/<vol> of volumes it never mounted,
// volumes/kubernetes.io~csi, volumes, plugins and the pod directory. A
// directory that is not empty (for example a target the driver left mounted)
// makes DeletePod fail with "volume paths are still present", as the kubelet
// reports it. DeletePod can be called again to retry.
func (k *Kubelet) DeletePod(ctx context.Context, pod *Pod) error {
	k.mu.Lock()
	p := k.pods[pod.UID]
	if p == nil {
		p = &kubeletPod{pod: clonePod(pod), volumes: map[string]InlineVolume{}}
		k.pods[pod.UID] = p
	}
	p.deleted = true
	p.volumes = map[string]InlineVolume{}
	names := k.trackedVolumesLocked(pod.UID)
	k.mu.Unlock()

	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			if err := k.tearDown(ctx, pod.UID, name); err != nil {
				errs[i] = fmt.Errorf("volume %s: %w", name, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := k.cleanupPodDirs(pod.UID); err != nil {
		return err
	}
	k.mu.Lock()
	if cur := k.pods[pod.UID]; cur == p {
		delete(k.pods, pod.UID)
	}
	k.mu.Unlock()
	return nil
}

// DeletePodOffline models deleting the pod from the API server while the
// kubelet is down: the pod leaves the desired state and nothing is sent to
// the driver and nothing on disk changes. The next Restart finds its volumes
// on disk and unpublishes them.
func (k *Kubelet) DeletePodOffline(pod *Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.pods[pod.UID]
	if p == nil {
		p = &kubeletPod{pod: clonePod(pod)}
		k.pods[pod.UID] = p
	}
	p.deleted = true
	p.volumes = map[string]InlineVolume{}
}

// OrphanPod models a pod that was deleted while the kubelet was down and
// whose directory <root>/pods/<uid> disappeared as well (a node that lost its
// kubelet pods directory). Nothing is sent to the driver: the driver's garbage
// collection must notice that the pod's target paths are gone. The kubelet
// forgets the pod (desired and actual state).
//
// The pod directory tree is removed with os.RemoveAll when nothing is mounted
// below it. When something is mounted below it (a real driver's mount), the
// mount points and the directories leading to them are kept and everything
// else, including vol_data.json files, is removed: unmounting is left to the
// driver, and removing files through a mount would destroy volume data.
func (k *Kubelet) OrphanPod(pod *Pod) error {
	k.mu.Lock()
	delete(k.pods, pod.UID)
	for key := range k.actual {
		if key.uid == pod.UID {
			delete(k.actual, key)
		}
	}
	k.mu.Unlock()

	dir := k.podDir(pod.UID)
	mounts, err := mountPointsUnder(dir)
	if err != nil {
		return err
	}
	if len(mounts) == 0 {
		return os.RemoveAll(dir)
	}
	return removeAllExcept(dir, mounts)
}

// cleanupPodDirs removes the pod's directories once no volume is tracked, like
// the kubelet's orphaned pod cleanup: empty volume directories first, then
// kubernetes.io~csi, volumes, plugins and the pod directory.
func (k *Kubelet) cleanupPodDirs(uid string) error {
	dir := k.podDir(uid)
	csiDir := filepath.Join(dir, volume.VolumesDir, volume.PluginDir)
	if entries, err := os.ReadDir(csiDir); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				_ = os.Remove(filepath.Join(csiDir, e.Name())) // only if empty
			}
		}
	}
	for _, d := range []string{csiDir, filepath.Join(dir, volume.VolumesDir), filepath.Join(dir, kubeletPluginsDir), dir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("drivertest: orphaned pod %q found, but volume paths are still present on disk: %w", uid, err)
		}
	}
	return nil
}

// removeMountDir is the kubelet's cleanup after an unpublish or a final publish
// failure. If target is a mount point nothing is removed and nil is returned.
// Otherwise target is removed (an error if it is not empty: the kubelet would
// retry), then vol_data.json and the parent directory.
func (k *Kubelet) removeMountDir(target string) error {
	mounted, err := isMountPoint(target)
	if err != nil {
		return err
	}
	if mounted {
		return nil
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("drivertest: failed to remove dir [%s]: %w", target, err)
	}
	parent := filepath.Dir(target)
	if err := os.Remove(filepath.Join(parent, volume.VolDataFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("drivertest: failed to delete volume data file: %w", err)
	}
	if err := os.Remove(parent); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("drivertest: failed to delete volume path [%s]: %w", parent, err)
	}
	return nil
}
