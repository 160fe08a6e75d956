package backendtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/backendtest"
	"github.com/ephemera-csi/ephemera/framework/stamp"
)

// dirBackend is a minimal directory backend with every optional interface: a
// driver author's backend as the suite expects it.
type dirBackend struct {
	root string
	// Faults for the negative tests.
	acceptUnknown, needState, keepOnDelete, alwaysHealthy, newPathEachCreate bool
	creates                                                                  atomic.Int64
}

func (b *dirBackend) Validate(v *api.Volume) error {
	if b.acceptUnknown {
		return nil
	}
	return v.Params.Only()
}

func (b *dirBackend) Create(_ context.Context, v *api.Volume) (api.Source, error) {
	name := v.ID
	if b.newPathEachCreate {
		name = fmt.Sprintf("%s-%d", v.ID, b.creates.Add(1))
	}
	p := filepath.Join(b.root, name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return api.Source{}, err
	}
	v.State = map[string]string{"path": p}
	return api.Source{Path: p}, nil
}

func (b *dirBackend) Delete(_ context.Context, v *api.Volume) error {
	if b.needState && v.State["path"] == "" {
		return errors.New("no path in State")
	}
	if b.keepOnDelete {
		return nil
	}
	return os.RemoveAll(filepath.Join(b.root, v.ID))
}

func (b *dirBackend) List(context.Context) ([]string, error) {
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.Name() != stamp.FileName {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

func (b *dirBackend) Stamp(context.Context) (string, error) { return stamp.Read(b.root) }

func (b *dirBackend) SetStamp(_ context.Context, id string) error { return stamp.Write(b.root, id) }

func (b *dirBackend) Check(_ context.Context, v *api.Volume) error {
	if b.alwaysHealthy {
		return nil
	}
	_, err := os.Stat(filepath.Join(b.root, v.ID))
	return err
}

func newTmpfs(t *testing.T) *tmpfs.Backend {
	t.Helper()
	b, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newDirBackend(t *testing.T) *dirBackend {
	root := filepath.Join(t.TempDir(), "volumes")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	return &dirBackend{root: root}
}

func TestFullBackend(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) framework.Backend { return newDirBackend(t) },
		backendtest.Options{Mount: true})
}

// broken are backends that break one rule each, run by TestBrokenBackends in a
// child process (the suite must fail them).
var broken = map[string]struct {
	backend func(t *testing.T) framework.Backend
	opts    backendtest.Options
	root    bool // needs mounts
	// failing subtests and a message each must print
	want map[string]string
}{
	"AcceptsUnknownAttribute": {
		backend: func(t *testing.T) framework.Backend { b := newDirBackend(t); b.acceptUnknown = true; return b },
		want:    map[string]string{"Validate": "accepted the unknown attribute"},
	},
	"DeleteNeedsState": {
		backend: func(t *testing.T) framework.Backend { b := newDirBackend(t); b.needState = true; return b },
		want: map[string]string{
			"Delete/NeverCreated": "with only ID and Backend",
			"Delete/FromIDOnly":   "with only ID and Backend",
		},
	},
	"LeaksStorage": {
		backend: func(t *testing.T) framework.Backend { b := newDirBackend(t); b.keepOnDelete = true; return b },
		want: map[string]string{
			"Delete/Twice":       "still holds the deleted volume",
			"Inventory":          "after deleting 1 of 3 volumes",
			"CrashBeforePublish": "after the startup reconcile",
			"Concurrency":        "still holds the deleted volume",
		},
	},
	"AlwaysHealthy": {
		backend: func(t *testing.T) framework.Backend { b := newDirBackend(t); b.alwaysHealthy = true; return b },
		want:    map[string]string{"Health": "Check of a deleted volume = nil"},
	},
	"NotIdempotent": {
		backend: func(t *testing.T) framework.Backend { b := newDirBackend(t); b.newPathEachCreate = true; return b },
		want:    map[string]string{"Create/Idempotent": "Create is not idempotent"},
	},
	"SizeNotEnforced": {
		backend: func(t *testing.T) framework.Backend { return newTmpfs(t) },
		// The backend mounts 16Mi; the suite is told 4Mi.
		opts: backendtest.Options{Params: map[string]string{"size": "16Mi"}, Size: 4 << 20, Mount: true},
		root: true,
		want: map[string]string{"Size": "the size is not enforced"},
	},
	"WrongFSType": {
		backend: func(t *testing.T) framework.Backend { return anyFSType{newTmpfs(t)} },
		opts:    backendtest.Options{Params: map[string]string{"size": "16Mi"}, FSType: "ext4", Mount: true},
		root:    true,
		want:    map[string]string{"Create/IdempotentWhileMounted": `filesystem mounted at the target is "tmpfs"`},
	},
}

// anyFSType is a tmpfs backend that accepts every fsType.
type anyFSType struct{ *tmpfs.Backend }

func (b anyFSType) Validate(v *api.Volume) error {
	v.FSType = ""
	err := b.Backend.Validate(v)
	v.FSType = "ext4"
	return err
}

const childEnv = "BACKENDTEST_BROKEN"

func TestBrokenBackendChild(t *testing.T) {
	name := os.Getenv(childEnv)
	if name == "" {
		t.Skip("run by TestBrokenBackends")
	}
	c := broken[name]
	backendtest.Run(t, c.backend, c.opts)
}

// TestBrokenBackends checks that the suite fails backends that break the
// contract, in the subtest concerned, with a useful message.
func TestBrokenBackends(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("child")
	}
	for name, c := range broken {
		t.Run(name, func(t *testing.T) {
			if c.root && os.Geteuid() != 0 {
				t.Skip("needs root")
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenBackendChild$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), childEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a backend that breaks the contract:\n%s", out)
			}
			for sub, msg := range c.want {
				if !strings.Contains(string(out), "--- FAIL: TestBrokenBackendChild/"+sub+" ") {
					t.Errorf("subtest %s did not fail", sub)
				}
				if !strings.Contains(string(out), msg) {
					t.Errorf("output lacks %q", msg)
				}
			}
			if strings.Contains(string(out), "was left mounted") {
				t.Errorf("a failing subtest left a mount behind")
			}
			if t.Failed() {
				t.Logf("child output:\n%s", out)
			}
		})
	}
}
