package metrics

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// CSIOperations is csi-lib-utils' operation histogram of a CSI plugin: same
// name, labels and buckets, read from the csi-lib-utils source this module
// requires (it is not linked: see doc.go).
func TestCSIOperationsMatchCSILibUtils(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/kubernetes-csi/csi-lib-utils").Output()
	if err != nil {
		t.Fatalf("locating csi-lib-utils: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatal("csi-lib-utils is not downloaded (go mod download)")
	}
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, "metrics", "metrics.go"), nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	strs := map[string]string{}
	var buckets []float64
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if i >= len(vs.Values) {
				continue
			}
			switch v := vs.Values[i].(type) {
			case *ast.BasicLit:
				if s, err := strconv.Unquote(v.Value); err == nil {
					strs[name.Name] = s
				}
			case *ast.CompositeLit:
				if name.Name != "operationsLatencyBuckets" {
					continue
				}
				for _, e := range v.Elts {
					x, err := strconv.ParseFloat(e.(*ast.BasicLit).Value, 64)
					if err != nil {
						t.Fatal(err)
					}
					buckets = append(buckets, x)
				}
			}
		}
		return true
	})
	if got := strs["SubsystemPlugin"] + "_" + strs["operationsLatencyMetricName"]; got != CSIOperations {
		t.Errorf("csi-lib-utils names the plugin histogram %q, we %q", got, CSIOperations)
	}
	for theirs, ours := range map[string]string{
		"labelCSIDriverName":    labelCSIDriver,
		"labelCSIOperationName": labelCSIMethod,
		"labelGrpcStatusCode":   labelCSICode,
	} {
		if strs[theirs] != ours {
			t.Errorf("csi-lib-utils %s = %q, ours %q", theirs, strs[theirs], ours)
		}
	}
	if !slices.Equal(buckets, csiBuckets) {
		t.Errorf("csi-lib-utils buckets %v, ours %v", buckets, csiBuckets)
	}
}
