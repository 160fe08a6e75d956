package podcgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Tree is a node's cgroup hierarchy as the kubelet lays out its pods in it:
// Find and Wait locate a pod's cgroup by its UID.
type Tree struct {
	h Hierarchy
	// memDir is the directory of the memory controller's root cgroup:
	// <mount>/memory on v1, the mount on v2.
	memDir string
	// checkMemory makes Find refuse a v2 pod cgroup without the memory
	// controller (a write there would charge an ancestor); tests on a
	// hierarchy with no controllers turn it off.
	checkMemory bool
	// afterMiss, when set, is called after each of Wait's misses: a test
	// hook.
	afterMiss func()
}

// Open checks h and finds its version (unless h.Version says it) and its
// memory controller. It fails with ErrUnsupported where there is no memory
// cgroup: not Linux, nothing cgroup-like at h.Mount.
func Open(h Hierarchy) (*Tree, error) {
	h.setDefaults()
	if err := h.check(); err != nil {
		return nil, err
	}
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: %s has no cgroups", ErrUnsupported, runtime.GOOS)
	}
	if h.Version == Detect {
		v, err := detect(h.Mount)
		if err != nil {
			return nil, err
		}
		h.Version = v
	}
	t := &Tree{h: h, memDir: h.Mount, checkMemory: true}
	if h.Version == V1 {
		t.memDir = filepath.Join(h.Mount, "memory")
	}
	return t, nil
}

// Hierarchy returns the tree's hierarchy, its defaults filled in and its
// version found.
func (t *Tree) Hierarchy() Hierarchy { return t.h }

// MemoryDir is the directory of the memory controller's root cgroup.
func (t *Tree) MemoryDir() string { return t.memDir }

// Kubepods is the directory of the kubelet's node-allocatable cgroup, the
// ancestor of every pod's.
func (t *Tree) Kubepods() string {
	return filepath.Join(t.memDir, filepath.FromSlash(KubepodsPath(t.h.Driver, t.h.Root)))
}

// Find returns the cgroup of the pod of uid, looked for in each QoS class's
// place. A pod that has none yet is a *NotFoundError (errors.Is ErrNotFound;
// also ErrNoPodCgroups when the kubelet's kubepods cgroup is missing too).
func (t *Tree) Find(uid string) (*Cgroup, error) {
	if err := checkUID(uid); err != nil {
		return nil, err
	}
	nf := &NotFoundError{UID: uid, Kubepods: t.Kubepods()}
	var found []*Cgroup
	for _, qos := range qosClasses {
		dir := filepath.Join(t.memDir, filepath.FromSlash(PodPath(t.h.Driver, t.h.Root, qos, uid)))
		fi, err := os.Lstat(dir)
		switch {
		case err == nil && fi.IsDir():
			found = append(found, &Cgroup{UID: uid, QoS: qos, Dir: dir, Version: t.h.Version, Driver: t.h.Driver})
		case err == nil:
			return nil, fmt.Errorf("pod %s: %s is not a directory", uid, dir)
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("pod %s: %w", uid, err)
		}
		nf.Tried = append(nf.Tried, dir)
	}
	switch len(found) {
	case 0:
		fi, err := os.Lstat(nf.Kubepods)
		switch {
		case err == nil:
			nf.KubepodsExists = fi.IsDir()
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("pod %s: %w", uid, err)
		}
		return nil, nf
	case 1:
	default:
		// A pod's class never changes: two are a tree this package does
		// not understand, and a guess could charge another party.
		dirs := make([]string, len(found))
		for i, c := range found {
			dirs[i] = c.Dir
		}
		return nil, fmt.Errorf("pod %s has a cgroup in more than one QoS class: %s", uid, strings.Join(dirs, ", "))
	}
	c := found[0]
	if t.checkMemory && c.Version == V2 {
		data, err := os.ReadFile(filepath.Join(c.Dir, "cgroup.controllers"))
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", uid, err)
		}
		if !slices.Contains(strings.Fields(string(data)), "memory") {
			return nil, fmt.Errorf("pod %s: %w: %s has no memory controller (its cgroup.controllers: %q)", uid, ErrUnsupported, c.Dir, strings.TrimSpace(string(data)))
		}
	}
	return c, nil
}

// Wait is Find until the pod's cgroup appears or ctx ends: the kubelet may
// call NodePublishVolume before its pod worker has created the pod's
// cgroup. It gives up at once on what waiting cannot change
// (ErrNoPodCgroups, a bad UID, ErrUnsupported) and returns the last
// NotFoundError, wrapped with ctx's error, when ctx ends first. It polls:
// every 5 ms at first, backing off to 100 ms.
func (t *Tree) Wait(ctx context.Context, uid string) (*Cgroup, error) {
	delay := 5 * time.Millisecond
	var timer *time.Timer
	for {
		c, err := t.Find(uid)
		if err == nil || !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNoPodCgroups) {
			return c, err
		}
		if t.afterMiss != nil {
			t.afterMiss()
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (waited: %w)", err, context.Cause(ctx))
		case <-timer.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}
