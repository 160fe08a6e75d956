package framework_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// A driver that meets a state file of a newer schema (a downgrade) does not
// start: the error names the file, both schema versions, the driver that last
// opened the file and this one, and the ways out; the file is neither changed
// nor moved aside as damaged.
func TestDowngradeRefused(t *testing.T) {
	stateDir := t.TempDir()
	path := filepath.Join(stateDir, framework.StateFile)
	st, err := boltstore.Open(path, boltstore.Options{Writer: "test.csi.ephemera.dev v0.2.0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schemaVersion"), []byte(strconv.Itoa(boltstore.SchemaVersion+1)))
	})
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	d, err := framework.New(framework.Options{
		DriverName: "test.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"tmpfs": newTmpfs(t, tmpfs.Options{})},
		Node: framework.NodeOptions{
			Version:        "v0.1.0",
			ID:             "node-1",
			KubeletRootDir: t.TempDir(),
			StateDir:       stateDir,
			Endpoint:       "unix://" + filepath.Join(t.TempDir(), "csi.sock"),
		},
		Volumes: framework.VolumeOptions{Mounter: mount.NewFake()},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Run(t.Context())
	if err == nil {
		t.Fatal("Run on a newer state file succeeded")
	}
	t.Logf("Run: %v", err)
	for _, want := range []string{
		path, "file schema 2, this driver knows 1",
		`last opened by "test.csi.ephemera.dev v0.2.0"`, `"test.csi.ephemera.dev v0.1.0" cannot read it`,
		"downgrades of the state file are not supported", "move the file aside",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q", want)
		}
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(before, after) {
		t.Errorf("the state file was changed (%v)", err)
	}
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), ".damaged-") {
			t.Errorf("the file was moved aside as damaged: %s", e.Name())
		}
	}
}
