// Package sanity runs the upstream csi-sanity suite (csi-test v5) against an
// Ephemera driver served in-process on a unix socket, with the real mounter
// and the tmpfs and dir backends. csi-sanity has no ephemeral-volume tests:
// every positive publish spec first calls CreateVolume, which a node-only
// driver does not have, so those specs are skipped (see README.md). What runs
// is Identity, NodeGetInfo/NodeGetCapabilities and argument validation.
package sanity

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// skip are the specs a node-only driver of ephemeral inline volumes cannot
// pass, as regular expressions on the full spec text (ginkgo SkipStrings).
// Each needs CreateVolume or a staged/expandable persistent volume.
var skip = []string{
	`\[Controller Server\]`,
	`should remove target path`,
	`single node single writer access mode is already mounted`,
	`volume does not exist on the specified path`,
	`NodeStageVolume should fail when no volume capability is provided`,
	`NodeExpandVolume should fail when no volume path is provided`,
	`node-expand is called after node-publish`,
	`should return health for a valid volume`,
	`Node Service should work`,
	`Node Service should be idempotent`,
}

// sc is registered once per binary: ginkgo allows one RunSpecs per process.
var sc = sanity.GinkgoTest(&cfg)

var cfg = sanity.NewTestConfig()

// report is the suite report, captured for the Go test's own assertions.
var report ginkgo.Report

var _ = ginkgo.ReportAfterSuite("capture", func(r ginkgo.Report) { report = r })

func TestSanity(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("csi-sanity runs the driver with the real mounter: needs root")
	}
	state := t.TempDir()
	h := drivertest.Start(t, framework.Options{
		DriverName: "sanity.csi.ephemera.dev",
		Backends: map[string]framework.Backend{
			"tmpfs": mustTmpfs(t),
			"dir":   mustDir(t, filepath.Join(state, "volumes")),
		},
		Node:    framework.NodeOptions{StateDir: state},
		Volumes: framework.VolumeOptions{DefaultBackend: "tmpfs"},
	})

	// csi-sanity creates and removes both directories itself; they must not
	// exist when the run starts.
	work := t.TempDir()
	cfg.Address = h.Options.Node.Endpoint
	cfg.TargetPath = filepath.Join(work, "csi-mount")
	cfg.StagingPath = filepath.Join(work, "csi-staging")
	t.Cleanup(sc.Finalize)

	gomega.RegisterFailHandler(ginkgo.Fail)
	suiteCfg, reporterCfg := ginkgo.GinkgoConfiguration()
	suiteCfg.SkipStrings = append(suiteCfg.SkipStrings, skip...)
	reporterCfg.NoColor = true
	if !testing.Verbose() {
		reporterCfg.Succinct = true
	}
	ok := ginkgo.RunSpecs(t, "Ephemera csi-sanity", suiteCfg, reporterCfg)

	var passed, skipped, pending, failed int
	for _, s := range report.SpecReports {
		if s.LeafNodeType != types.NodeTypeIt {
			continue
		}
		switch {
		case s.State.Is(types.SpecStatePassed):
			passed++
			t.Logf("passed: %s", s.FullText())
		case s.State.Is(types.SpecStateSkipped):
			skipped++
		case s.State.Is(types.SpecStatePending):
			pending++
		default:
			failed++
			t.Errorf("spec %q: %s: %s", s.FullText(), s.State, s.Failure.Message)
		}
	}
	t.Logf("csi-sanity: %d passed, %d skipped, %d pending (marked pending upstream), %d failed", passed, skipped, pending, failed)
	if !ok || failed > 0 {
		t.Fatalf("csi-sanity failed (%d specs failed)", failed)
	}
	if passed == 0 {
		t.Fatal("csi-sanity ran no specs")
	}
	for _, p := range []string{cfg.TargetPath, cfg.StagingPath} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind after csi-sanity (err %v)", p, err)
		}
	}
	if m := mountsUnder(t, work, state, h.Options.Node.KubeletRootDir); len(m) > 0 {
		t.Errorf("mounts left behind: %v", m)
	}
}

// mountsUnder returns the mount points below any of dirs.
func mountsUnder(t *testing.T, dirs ...string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		for _, d := range dirs {
			if strings.HasPrefix(f[4], d+"/") {
				out = append(out, f[4])
			}
		}
	}
	return out
}

func mustTmpfs(t *testing.T) *tmpfs.Backend {
	t.Helper()
	b, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustDir(t *testing.T, root string) *dir.Backend {
	t.Helper()
	b, err := dir.New(dir.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
