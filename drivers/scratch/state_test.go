package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

func TestStateCommand(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := stateCommand(append(args, "--state-dir", dir, "--timeout", "200ms"), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, _, stderr := run("check"); code != 2 || !strings.Contains(stderr, "no state file") {
		t.Errorf("check without a file: %d %q", code, stderr)
	}
	path := filepath.Join(dir, framework.StateFile)
	st, err := boltstore.Open(path, boltstore.Options{Writer: "scratch.csi.ephemera.dev v0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	rec := &store.Record{VolumeID: "csi-1", Backend: "tmpfs", Phase: store.PhasePublished, Created: time.Now()}
	if err := st.Put(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	// While the driver holds the file, the tools wait for its lock and give up.
	if code, _, stderr := run("check"); code != 2 || !strings.Contains(stderr, "locked") {
		t.Errorf("check while locked: %d %q", code, stderr)
	}
	st.Close()
	if code, stdout, _ := run("check"); code != 0 || !strings.Contains(stdout, "records:        1") || !strings.Contains(stdout, "last opened by: scratch.csi.ephemera.dev v0.1.0\n") || !strings.HasSuffix(stdout, "OK\n") {
		t.Errorf("check of a healthy file: %d %q", code, stdout)
	}
	code, stdout, _ := run("dump")
	var rep boltstore.Report
	if err := json.Unmarshal([]byte(stdout), &rep); code != 0 || err != nil || len(rep.Records) != 1 || rep.Records[0].VolumeID != "csi-1" {
		t.Errorf("dump: %d %v %+v", code, err, rep)
	}
	if err := os.Truncate(path, 16<<10); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ := run("check"); code != 1 || !strings.Contains(stdout, "DAMAGED") {
		t.Errorf("check of a damaged file: %d %q", code, stdout)
	}
	if code, _, stderr := run("frobnicate"); code != 2 || !strings.Contains(stderr, "unknown state command") {
		t.Errorf("unknown command: %d %q", code, stderr)
	}
}
