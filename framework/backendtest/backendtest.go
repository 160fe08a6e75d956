package backendtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// Options describe the volumes Run creates and what it may expect of them.
type Options struct {
	// Params are the volumeAttributes of a valid volume, as a pod author writes
	// them, for example {"size": "16Mi"}. The framework's own attributes ("size",
	// "backend") are handled as the framework handles them: "size" becomes
	// Volume.Size, "backend" the backend's name (default "backendtest"), and
	// neither reaches Volume.Params. A backend that is not a
	// [framework.Validator] accepts no other attribute.
	Params map[string]string
	// Size is the size in bytes the backend is expected to enforce on a volume
	// made from Params (usually the "size" attribute). 0 means the backend does
	// not enforce sizes and the Size subtest is skipped. Checked only with Mount.
	Size int64
	// FSType is the pod's fsType (Volume.FSType) for every volume. With Mount,
	// the filesystem mounted from the returned Source must be of this type (as
	// shown in /proc/self/mountinfo), for example "ext4" for a backend that
	// formats a block device. "" leaves fsType unset; a Source with an FSType is
	// then checked against its own FSType.
	FSType string
	// Mount publishes the returned Sources through mount.New(), as the framework
	// does, on a target below a temporary kubelet root, and checks data, sizes
	// and filesystem types there. Mounting needs Linux and root: when either is
	// missing, the subtests that mount are skipped.
	Mount bool
}

// defaultBackendName is the backend's name when Params has no "backend".
const defaultBackendName = "backendtest"

// concurrency is the number of goroutines of the Concurrency subtest.
const concurrency = 16

// opTimeout bounds every backend call made from a cleanup function (the test's
// own context is already canceled then).
const opTimeout = 2 * time.Minute

// Run checks that the backends made by newBackend fulfil the [framework.Backend]
// contract and, when they implement them, the [framework.Validator],
// [framework.Lister] and [framework.HealthChecker] contracts. newBackend is
// called once per subtest and must return a backend without volumes; keep its
// storage in t.TempDir() so that subtests are independent. Every subtest deletes
// the volumes it created and unmounts what it mounted, even when it fails.
func Run(t *testing.T, newBackend func(t *testing.T) framework.Backend, opts Options) {
	t.Helper()
	s := &suite{newBackend: newBackend, opts: opts}
	s.backendName = api.Params(opts.Params).String(api.ParamBackend, defaultBackendName)

	t.Run("Validate", s.testValidate)
	t.Run("Create", func(t *testing.T) {
		t.Run("Idempotent", s.testCreateIdempotent)
		t.Run("IdempotentWhileMounted", s.testCreateWhileMounted)
	})
	t.Run("Delete", func(t *testing.T) {
		t.Run("NeverCreated", s.testDeleteNeverCreated)
		t.Run("Twice", s.testDeleteTwice)
		t.Run("FromIDOnly", s.testDeleteFromIDOnly)
		t.Run("RecreatedIsEmpty", s.testRecreatedIsEmpty)
	})
	t.Run("Size", s.testSize)
	t.Run("Inventory", s.testInventory)
	t.Run("CrashBeforePublish", s.testCrashBeforePublish)
	t.Run("Health", s.testHealth)
	t.Run("Concurrency", s.testConcurrency)
	t.Run("PublishThroughDriver", s.testPublishThroughDriver)
}

type suite struct {
	newBackend  func(t *testing.T) framework.Backend
	opts        Options
	backendName string
}

// env is the per-subtest state: one backend and a temporary kubelet root below
// which volumes are mounted.
type env struct {
	s           *suite
	b           framework.Backend
	base        string // temporary directory of the subtest, symlinks resolved
	kubeletRoot string
	mounter     mount.Interface
	mu          sync.Mutex
	n           int // volumes made so far
}

func (s *suite) setup(t *testing.T) *env {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := s.newBackend(t)
	if b == nil {
		t.Fatal("newBackend returned nil")
	}
	e := &env{s: s, b: b, base: base, kubeletRoot: filepath.Join(base, "kubelet")}
	// Registered after newBackend's cleanups, so it runs before them: nothing
	// the subtest mounted may remain when the backend's storage goes.
	t.Cleanup(func() { unmountLeftovers(t, base) })
	return e
}

// requireMount skips t unless volumes can be mounted.
func (e *env) requireMount(t *testing.T) {
	t.Helper()
	if !e.s.opts.Mount {
		t.Skip("Options.Mount is false")
	}
	if ok, why := canMount(); !ok {
		t.Skip(why)
	}
	if e.mounter == nil {
		e.mounter = mount.New()
	}
}

// volume builds the volume a pod with Options.Params would get and validates it
// like the framework's request parsing does.
func (e *env) volume(t *testing.T) *api.Volume {
	t.Helper()
	v, err := e.s.buildVolume(e.nextName(), e.kubeletRoot)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.validate(e.b, v); err != nil {
		t.Fatalf("Options.Params %v must describe a valid volume: %v", e.s.opts.Params, err)
	}
	return v
}

func (e *env) nextName() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	return fmt.Sprintf("vol-%d", e.n)
}

// buildVolume builds the volume as the framework does (framework/internal/volume):
// the framework's attributes are removed from Params, "size" becomes Size,
// "backend" names the backend.
func (s *suite) buildVolume(name, kubeletRoot string) (*api.Volume, error) {
	uid := newUID()
	params := api.Params(s.opts.Params)
	size, err := params.Quantity(api.ParamSize, 0)
	if err != nil {
		return nil, fmt.Errorf("Options.Params: %w", err)
	}
	return &api.Volume{
		ID:         api.VolumeHandle(uid, name),
		Name:       name,
		TargetPath: volume.TargetPath(kubeletRoot, uid, name),
		Pod: api.Pod{
			Namespace:      "backendtest",
			Name:           "pod-" + name,
			UID:            uid,
			ServiceAccount: "default",
		},
		Backend: s.backendName,
		FSType:  s.opts.FSType,
		Size:    size,
		Params:  volume.BackendParams(params),
	}, nil
}

// validate applies what the framework checks before the first Create.
func (s *suite) validate(b framework.Backend, v *api.Volume) error {
	if val, ok := framework.As[framework.Validator](b); ok {
		return val.Validate(v)
	}
	if err := volume.CheckWithoutValidator(v); err != nil {
		return fmt.Errorf("the backend is not a framework.Validator, so the framework refuses every attribute and fsType: %w", err)
	}
	return nil
}

// create calls Create and deletes the volume at cleanup.
func (e *env) create(t *testing.T, v *api.Volume) api.Source {
	t.Helper()
	e.deleteAtCleanup(t, v)
	src, err := e.b.Create(t.Context(), v)
	if err != nil {
		t.Fatalf("Create(%s): %v", v.ID, err)
	}
	checkSource(t, src)
	return src
}

// deleteAtCleanup deletes v when t ends; Delete must be nil for a volume that
// is already gone.
func (e *env) deleteAtCleanup(t *testing.T, v *api.Volume) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := e.b.Delete(ctx, cloneVolume(v)); err != nil {
			t.Errorf("cleanup: Delete(%s): %v", v.ID, err)
		}
	})
}

func checkSource(t *testing.T, src api.Source) {
	t.Helper()
	if src.Path == "" {
		t.Errorf("Create returned a Source without Path: %+v", src)
		return
	}
	if !src.IsDir() {
		return
	}
	if !filepath.IsAbs(src.Path) {
		t.Errorf("Create returned a directory Source with a relative Path %q", src.Path)
		return
	}
	if fi, err := os.Stat(src.Path); err != nil {
		t.Errorf("Create returned a directory Source that cannot be published: %v", err)
	} else if !fi.IsDir() {
		t.Errorf("Create returned a directory Source %q that is not a directory (mode %s)", src.Path, fi.Mode())
	}
}

func cloneVolume(v *api.Volume) *api.Volume {
	c := *v
	c.Params = v.Params.Clone()
	if v.State != nil {
		c.State = make(map[string]string, len(v.State))
		for k, val := range v.State {
			c.State[k] = val
		}
	}
	return &c
}

// persisted returns v as the framework hands it back after Create: the same
// fields and the State Create recorded, without Secrets.
func persisted(v *api.Volume) *api.Volume {
	c := cloneVolume(v)
	c.Secrets = nil
	return c
}

// orphan is what the startup reconcile passes to Delete for storage without a
// record.
func orphan(v *api.Volume) *api.Volume { return volume.Orphan(v.ID, v.Backend) }

func (s *suite) testValidate(t *testing.T) {
	e := s.setup(t)
	val, ok := framework.As[framework.Validator](e.b)
	if !ok {
		v, err := s.buildVolume("vol-1", e.kubeletRoot)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.validate(e.b, v); err != nil {
			t.Fatalf("Options.Params %v: %v", s.opts.Params, err)
		}
		t.Skip("not a framework.Validator: the framework refuses every attribute itself")
	}
	v, err := s.buildVolume("vol-1", e.kubeletRoot)
	if err != nil {
		t.Fatal(err)
	}
	if err := val.Validate(v); err != nil {
		t.Errorf("Validate(Options.Params %v) = %v, want nil", s.opts.Params, err)
	}

	const unknown = "backendtest-unknown-attribute"
	v, err = s.buildVolume("vol-2", e.kubeletRoot)
	if err != nil {
		t.Fatal(err)
	}
	v.Params[unknown] = "x"
	err = val.Validate(v)
	switch {
	case err == nil:
		t.Errorf("Validate accepted the unknown attribute %q; a typo in a pod spec must fail loudly (use api.Params.Only)", unknown)
	case !errors.Is(err, api.ErrInvalidParams):
		t.Errorf("Validate with unknown attribute %q = %v, want an error wrapping api.ErrInvalidParams", unknown, err)
	case !strings.Contains(err.Error(), unknown):
		t.Errorf("Validate with unknown attribute %q = %q: the message should name the attribute for the pod author", unknown, err)
	}

	// Validate runs before any side effect.
	if l, ok := framework.As[framework.Lister](e.b); ok {
		ids, err := l.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(ids) != 0 {
			t.Errorf("List after Validate only = %v, want none: Validate must not create storage", ids)
		}
	}
}

func (s *suite) testCreateIdempotent(t *testing.T) {
	e := s.setup(t)
	v := e.volume(t)
	src1 := e.create(t, v)
	// The framework calls Create again (a retry, a repair) with the volume as
	// persisted after the first Create, State included.
	v2 := persisted(v)
	src2, err := e.b.Create(t.Context(), v2)
	if err != nil {
		t.Fatalf("second Create(%s): %v", v.ID, err)
	}
	if !reflect.DeepEqual(src1, src2) {
		t.Errorf("Create is not idempotent: first Source %+v, second %+v", src1, src2)
	}
	if !reflect.DeepEqual(v.State, v2.State) {
		t.Errorf("second Create changed State from %v to %v", v.State, v2.State)
	}
}

func (s *suite) testCreateWhileMounted(t *testing.T) {
	e := s.setup(t)
	e.requireMount(t)
	v := e.volume(t)
	src1 := e.create(t, v)
	e.mount(t, v, src1)
	want := randomBytes(64 << 10)
	payload := filepath.Join(v.TargetPath, "payload")
	if err := writeAndSync(payload, want); err != nil {
		t.Fatalf("writing into the mounted volume: %v", err)
	}

	src2, err := e.b.Create(t.Context(), persisted(v))
	if err != nil {
		t.Fatalf("Create of a mounted volume: %v", err)
	}
	if !reflect.DeepEqual(src1, src2) {
		t.Errorf("Create of a mounted volume returned Source %+v, want %+v as at the first Create", src2, src1)
	}
	got, err := os.ReadFile(payload)
	if err != nil {
		t.Fatalf("data written before the second Create: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("data written before the second Create changed (%d bytes, want %d)", len(got), len(want))
	}
	e.checkMounted(t, v.TargetPath, src1)
}

func (s *suite) testDeleteNeverCreated(t *testing.T) {
	e := s.setup(t)
	v := e.volume(t)
	if err := e.b.Delete(t.Context(), v); err != nil {
		t.Errorf("Delete of a volume never created = %v, want nil", err)
	}
	if err := e.b.Delete(t.Context(), orphan(v)); err != nil {
		t.Errorf("Delete of a volume never created, with only ID and Backend = %v, want nil", err)
	}
}

func (s *suite) testDeleteTwice(t *testing.T) {
	e := s.setup(t)
	v := e.volume(t)
	e.create(t, v)
	for i := range 2 {
		if err := e.b.Delete(t.Context(), persisted(v)); err != nil {
			t.Errorf("Delete #%d = %v, want nil", i+1, err)
		}
	}
	e.checkGone(t, v.ID)
}

func (s *suite) testDeleteFromIDOnly(t *testing.T) {
	e := s.setup(t)
	v := e.volume(t)
	src := e.create(t, v)
	e.checkPresent(t, v.ID)
	if err := e.b.Delete(t.Context(), orphan(v)); err != nil {
		t.Fatalf("Delete with only ID and Backend (as the startup reconcile calls it) = %v, want nil", err)
	}
	e.checkGone(t, v.ID)
	if _, ok := framework.As[framework.Lister](e.b); !ok && src.IsDir() {
		// Without an inventory, the directory is all there is to check.
		if _, err := os.Lstat(src.Path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Delete with only ID and Backend left the volume's directory %s (Lstat: %v)", src.Path, err)
		}
	}
}

func (s *suite) testRecreatedIsEmpty(t *testing.T) {
	e := s.setup(t)
	e.requireMount(t)
	v := e.volume(t)
	src := e.create(t, v)
	e.mount(t, v, src)
	marker := filepath.Join(v.TargetPath, "backendtest-marker")
	if err := writeAndSync(marker, []byte("left by a previous pod")); err != nil {
		t.Fatalf("writing into the mounted volume: %v", err)
	}
	e.unmount(t, v.TargetPath)
	if err := e.b.Delete(t.Context(), persisted(v)); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	// The same pod UID and volume name again: a fresh volume.
	v2 := cloneVolume(v)
	v2.State = nil
	src2 := e.create(t, v2)
	e.mount(t, v2, src2)
	if _, err := os.Lstat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a volume created again after Delete holds the previous volume's data (Lstat %s: %v)", marker, err)
	}
}

func (s *suite) testSize(t *testing.T) {
	if s.opts.Size <= 0 {
		t.Skip("Options.Size is 0: the backend does not enforce sizes")
	}
	e := s.setup(t)
	e.requireMount(t)
	v := e.volume(t)
	src := e.create(t, v)
	e.mount(t, v, src)

	half := filepath.Join(v.TargetPath, "half")
	if err := writeSize(half, s.opts.Size/2); err != nil {
		t.Fatalf("writing %d bytes (half the size) into a volume of %d bytes: %v", s.opts.Size/2, s.opts.Size, err)
	}
	if err := os.Remove(half); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(v.TargetPath, "over")
	n := s.opts.Size + 1<<20
	err := writeSize(over, n)
	switch {
	case err == nil:
		t.Errorf("wrote %d bytes into a volume of %d bytes: the size is not enforced", n, s.opts.Size)
	case !isNoSpace(err):
		t.Errorf("writing %d bytes into a volume of %d bytes: %v, want ENOSPC or EDQUOT", n, s.opts.Size, err)
	}
	_ = os.Remove(over)
}

func (s *suite) testInventory(t *testing.T) {
	e := s.setup(t)
	l, ok := framework.As[framework.Lister](e.b)
	if !ok {
		t.Skip("not a framework.Lister")
	}
	list := func() map[string]bool {
		t.Helper()
		ids, err := l.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		set := make(map[string]bool, len(ids))
		for _, id := range ids {
			if set[id] {
				t.Errorf("List returned %s twice: %v", id, ids)
			}
			set[id] = true
		}
		return set
	}
	before := list()
	if len(before) != 0 {
		t.Logf("List of a new backend = %v; newBackend should return a backend without volumes", sortedKeys(before))
	}
	expect := func(when string, want ...*api.Volume) {
		t.Helper()
		got := list()
		for id := range before {
			delete(got, id)
		}
		wantIDs := map[string]bool{}
		for _, v := range want {
			wantIDs[v.ID] = true
		}
		if !reflect.DeepEqual(got, wantIDs) {
			t.Errorf("%s: List = %v, want %v", when, sortedKeys(got), sortedKeys(wantIDs))
		}
	}
	vols := []*api.Volume{e.volume(t), e.volume(t), e.volume(t)}
	for _, v := range vols {
		e.create(t, v)
	}
	expect("after creating 3 volumes", vols...)
	if err := e.b.Delete(t.Context(), persisted(vols[0])); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	expect("after deleting 1 of 3 volumes", vols[1:]...)
	for _, v := range vols[1:] {
		if err := e.b.Delete(t.Context(), persisted(v)); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	expect("after deleting all volumes")
}

func (s *suite) testCrashBeforePublish(t *testing.T) {
	e := s.setup(t)
	l, ok := framework.As[framework.Lister](e.b)
	if !ok {
		t.Skip("not a framework.Lister: the startup reconcile can only find storage without a record through an inventory, " +
			"so such a backend must keep nothing outside the published mount (like tmpfs, whose memory is the mount)")
	}
	has := func(id string) bool {
		t.Helper()
		ids, err := l.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		return slices.Contains(ids, id)
	}
	// A driver whose state file was lost (a new state dir) finds storage without
	// a record: it cannot tell a leftover from a live volume whose record is
	// gone, so the storage must be kept.
	v := e.volume(t)
	e.create(t, v)
	logs := driverLogs(t)
	opts := framework.Options{
		Backends:      map[string]framework.Backend{s.backendName: e.b},
		Node:          framework.NodeOptions{StateDir: filepath.Join(t.TempDir(), "state")},
		Observability: framework.ObservabilityOptions{Logger: logs},
	}
	h := drivertest.Start(t, opts)
	h.Stop()
	if !has(v.ID) {
		t.Fatalf("a driver with a new state file deleted storage it could not prove a leftover (%s)", v.ID)
	}
	if _, ok := framework.As[framework.Stamper](e.b); !ok {
		return // without a stamp, storage without a record is always kept
	}
	// That driver stamped the storage area with its state's identity. Storage
	// created afterwards without a record (a crash between Create and the
	// record: the framework writes the record first, so only a damaged store
	// gets here) is provably a leftover of that same state: deleted.
	w := e.volume(t)
	e.create(t, w)
	drivertest.Start(t, opts)
	if has(w.ID) {
		t.Errorf("after the startup reconcile, the inventory still holds %s, created without a record under the stamped state", w.ID)
	}
	if !has(v.ID) {
		t.Errorf("the adopted storage %s (kept as unclaimed) was deleted", v.ID)
	}
}

func (s *suite) testHealth(t *testing.T) {
	e := s.setup(t)
	hc, ok := framework.As[framework.HealthChecker](e.b)
	if !ok {
		t.Skip("not a framework.HealthChecker")
	}
	v := e.volume(t)
	src := e.create(t, v)
	mounted := false
	if s.opts.Mount {
		if ok, _ := canMount(); ok {
			e.requireMount(t)
			e.mount(t, v, src)
			mounted = true
		}
	}
	if err := hc.Check(t.Context(), persisted(v)); err != nil {
		t.Errorf("Check of a created volume = %v, want nil", err)
	}
	if mounted {
		e.unmount(t, v.TargetPath)
	}
	if err := e.b.Delete(t.Context(), persisted(v)); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := hc.Check(t.Context(), persisted(v)); err == nil {
		t.Errorf("Check of a deleted volume = nil, want an error")
	}
}

func (s *suite) testConcurrency(t *testing.T) {
	e := s.setup(t)
	vols := make([]*api.Volume, concurrency)
	for i := range vols {
		vols[i] = e.volume(t)
		e.deleteAtCleanup(t, vols[i])
	}
	errs := make([]error, concurrency)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, v := range vols {
		wg.Go(func() {
			<-start
			if _, err := e.b.Create(t.Context(), v); err != nil {
				errs[i] = fmt.Errorf("Create(%s): %w", v.ID, err)
				return
			}
			if err := e.b.Delete(t.Context(), persisted(v)); err != nil {
				errs[i] = fmt.Errorf("Delete(%s): %w", v.ID, err)
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for _, v := range vols {
		e.checkGone(t, v.ID)
	}
}

func (s *suite) testPublishThroughDriver(t *testing.T) {
	e := s.setup(t)
	e.requireMount(t)
	logs := driverLogs(t)
	h := drivertest.Start(t, framework.Options{
		Backends:      map[string]framework.Backend{s.backendName: e.b},
		Observability: framework.ObservabilityOptions{Logger: logs},
	})
	t.Cleanup(func() { unmountLeftovers(t, h.Options.Node.KubeletRootDir) })
	k := h.Kubelet
	pod := k.NewPod("backendtest", "driver")
	vol := drivertest.InlineVolume{Name: "data", FSType: s.opts.FSType, Attributes: s.opts.Params}
	if err := k.Publish(t.Context(), pod, vol); err != nil {
		t.Fatalf("NodePublishVolume with attributes %v: %v", s.opts.Params, err)
	}
	target := k.TargetPath(pod, vol.Name)
	if err := writeAndSync(filepath.Join(target, "hello"), []byte("hello")); err != nil {
		t.Errorf("writing into the published volume: %v", err)
	}
	id := api.VolumeHandle(pod.UID, vol.Name)
	e.checkPresent(t, id)
	if err := k.DeletePod(t.Context(), pod); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target %s remains after the pod was deleted (Lstat: %v)", target, err)
	}
	e.checkGone(t, id)
}

// checkPresent checks that a Lister lists id.
func (e *env) checkPresent(t *testing.T, id string) {
	t.Helper()
	if l, ok := framework.As[framework.Lister](e.b); ok {
		ids, err := l.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if !slices.Contains(ids, id) {
			t.Errorf("List = %v lacks the created volume %s", ids, id)
		}
	}
}

// checkGone checks that a Lister no longer lists id.
func (e *env) checkGone(t *testing.T, id string) {
	t.Helper()
	if l, ok := framework.As[framework.Lister](e.b); ok {
		ids, err := l.List(t.Context())
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if slices.Contains(ids, id) {
			t.Errorf("List = %v still holds the deleted volume %s", ids, id)
		}
	}
}

// driverLogs returns a logger for a driver under test whose output is shown
// only when the test fails.
func driverLogs(t *testing.T) klog.Logger {
	t.Helper()
	w := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("driver log:\n%s", w.String())
		}
	})
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(w), textlogger.Verbosity(4)))
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// newUID returns a random pod UID in the Kubernetes (UUID) form.
func newUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func writeAndSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeSize writes n bytes of incompressible data to path and syncs it, so that
// a filesystem with delayed allocation reports a full disk.
func writeSize(path string, n int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	buf := randomBytes(1 << 20)
	for n > 0 && err == nil {
		chunk := buf[:min(n, int64(len(buf)))]
		_, err = f.Write(chunk)
		n -= int64(len(chunk))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
