// Package monitoring checks the monitoring shipped in deploy/ against the
// metrics a running driver serves: every metric name in the PrometheusRule's
// alerts and in the Grafana dashboard's queries must be one the driver
// exports, so that no alert or panel silently watches nothing.
package monitoring

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// served starts a driver (fake mounter, no root), makes every kind of series
// exist (a publish, an unpublish, a refused publish, a probe) and returns the
// metric names /metrics lists, histogram and summary suffixes included.
func served(t *testing.T) map[string]bool {
	t.Helper()
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fake := mount.NewFake()
	yes, no, file := true, false, "File"
	h := drivertest.Start(t, framework.Options{
		DriverName: "monitoring.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"tmpfs": mem},
		// A content provider (with nothing to write) makes the content
		// series exist.
		Content: framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return nil, nil }),
		Volumes: framework.VolumeOptions{Mounter: fake},
		Limits:  framework.LimitOptions{Capacity: map[string]int64{"tmpfs": 1 << 30}},
		State:   framework.StateOptions{Store: memstore.New()},
		Observability: framework.ObservabilityOptions{
			CSIDrivers: csiDriverFunc(func(_ context.Context, name string) (*api.CSIDriver, error) {
				return &api.CSIDriver{Name: name, UID: "u", AttachRequired: &no, PodInfoOnMount: &yes,
					VolumeLifecycleModes: []string{"Ephemeral"}, FSGroupPolicy: &file}, nil
			}),
			MetricsAddress: "127.0.0.1:0",
		},
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "p")
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}}
	fake.AddDir(filepath.Dir(k.TargetPath(pod, "v")))
	// The fake mounter mounts nothing: the content is written into the
	// target's real directory.
	if err := os.MkdirAll(k.TargetPath(pod, "v"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Node.NodePublishVolume(ctx, k.PublishRequest(pod, vol)); err != nil {
		t.Fatal(err)
	}
	bad := drivertest.InlineVolume{Name: "bad", Attributes: map[string]string{"size": "1Mi", "typo": "x"}}
	if _, err := h.Node.NodePublishVolume(ctx, k.PublishRequest(pod, bad)); err == nil {
		t.Fatal("a publish with an unknown attribute succeeded")
	}
	if err := k.Unpublish(ctx, pod, "v"); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get("http://" + h.Driver().MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		names[metricName.FindString(line)] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// csiDriverFunc answers the startup check of the CSIDriver object, so that
// its metric exists as with API access.
type csiDriverFunc func(ctx context.Context, name string) (*api.CSIDriver, error)

func (f csiDriverFunc) GetCSIDriver(ctx context.Context, name string) (*api.CSIDriver, error) {
	return f(ctx, name)
}

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// A metric in PromQL: an identifier followed by a selector or a range,
	// or one of the driver's prefixes.
	queried = regexp.MustCompile(`\b((?:ephemera|csi_plugin|process|go)_[a-zA-Z0-9_:]*)`)
	// Inside {...} and "...", identifiers are label names and values.
	selectors = regexp.MustCompile(`\{[^}]*\}|"[^"]*"`)
)

// metricsIn returns the metric names a PromQL expression reads.
func metricsIn(expr string) []string {
	var out []string
	for _, m := range queried.FindAllStringSubmatch(selectors.ReplaceAllString(expr, ""), -1) {
		out = append(out, m[1])
	}
	return out
}

func repoFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMonitoringNamesServedMetrics(t *testing.T) {
	names := served(t)
	for _, want := range []string{"ephemera_rpc_duration_seconds_bucket", "csi_plugin_operations_seconds_count", "ephemera_capacity_bytes", "ephemera_csidriver_misconfigured", "process_resident_memory_bytes"} {
		if !names[want] {
			t.Fatalf("the driver does not serve %s; the check below would prove nothing", want)
		}
	}
	check := func(where, expr string) int {
		ms := metricsIn(expr)
		for _, m := range ms {
			if !names[m] {
				t.Errorf("%s queries %s, which the driver does not serve:\n%s", where, m, expr)
			}
		}
		return len(ms)
	}

	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(repoFile(t, "deploy/components/monitoring/prometheusrule.yaml"), &rule); err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts++
			if check("alert "+r.Alert, r.Expr) == 0 {
				t.Errorf("alert %s reads no metric of the driver: %s", r.Alert, r.Expr)
			}
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts in the PrometheusRule", alerts)
	}

	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(repoFile(t, "deploy/monitoring/grafana-dashboard.json"), &dash); err != nil {
		t.Fatal(err)
	}
	exprs := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs += check("dashboard panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			s, _ := q["query"].(string)
			check("dashboard variable "+v.Name, s)
		}
	}
	if len(dash.Panels) < 5 || exprs < 10 {
		t.Errorf("dashboard: %d panels reading %d metrics", len(dash.Panels), exprs)
	}
}

// The extraction itself: label names, label values and functions are not
// metrics.
func TestMetricsIn(t *testing.T) {
	got := metricsIn(`histogram_quantile(0.99, sum by (le) (rate(ephemera_rpc_duration_seconds_bucket{method="NodePublishVolume", code=~"ephemera_x"}[5m]))) / ephemera_capacity_bytes`)
	if strings.Join(got, " ") != "ephemera_rpc_duration_seconds_bucket ephemera_capacity_bytes" {
		t.Errorf("metricsIn = %q", got)
	}
}
