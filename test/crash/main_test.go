//go:build linux

package crash

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var (
	// skipReason, when set, makes every test skip (not root).
	skipReason string
	// driverBin is the scratch driver built with -tags failpoints.
	driverBin string
	// publishFailpoints and unpublishFailpoints are failpoint.Publish and
	// failpoint.Unpublish, read from the source (see failpointLists).
	publishFailpoints, unpublishFailpoints []string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		skipReason = "crash tests need root: they mount tmpfs and bind mounts and kill the driver with SIGKILL (run: sudo go test ./test/crash/)"
		return m.Run()
	}
	repo, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash:", err)
		return 1
	}
	if publishFailpoints, unpublishFailpoints, err = failpointLists(repo); err != nil {
		fmt.Fprintln(os.Stderr, "crash:", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "crash-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	driverBin = filepath.Join(tmp, "scratch")
	build := exec.Command("go", "build", "-tags", "failpoints", "-o", driverBin, "./drivers/scratch")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "crash: building the scratch driver with failpoints: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// repoRoot is the directory of the module's go.mod.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// failpointLists returns the failpoint names of publish and unpublish, in order.
// The failpoint package is internal to framework/, so this package cannot import
// it; reading failpoint.Publish and failpoint.Unpublish from its source keeps the
// tests covering every failpoint that is added there.
func failpointLists(repo string) (publish, unpublish []string, err error) {
	path := filepath.Join(repo, "framework", "internal", "failpoint", "failpoint.go")
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, bytes.NewReader(src), 0)
	if err != nil {
		return nil, nil, err
	}
	consts := map[string]string{}
	lists := map[string][]ast.Expr{}
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range gd.Specs {
			vs, ok := spec.(*ast.ValueSpec)
			if !ok {
				continue
			}
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				switch v := vs.Values[i].(type) {
				case *ast.BasicLit:
					if v.Kind == token.STRING {
						if s, err := strconv.Unquote(v.Value); err == nil {
							consts[name.Name] = s
						}
					}
				case *ast.CompositeLit:
					lists[name.Name] = v.Elts
				}
			}
		}
	}
	resolve := func(list string) ([]string, error) {
		elts := lists[list]
		if len(elts) == 0 {
			return nil, fmt.Errorf("%s: no failpoint list %s", path, list)
		}
		var out []string
		for _, e := range elts {
			switch e := e.(type) {
			case *ast.Ident:
				s, ok := consts[e.Name]
				if !ok {
					return nil, fmt.Errorf("%s: %s lists %s, which is not a string constant", path, list, e.Name)
				}
				out = append(out, s)
			case *ast.BasicLit:
				s, err := strconv.Unquote(e.Value)
				if err != nil {
					return nil, fmt.Errorf("%s: %s: %w", path, list, err)
				}
				out = append(out, s)
			default:
				return nil, fmt.Errorf("%s: %s has an element this test cannot read (%T)", path, list, e)
			}
		}
		return out, nil
	}
	if publish, err = resolve("Publish"); err != nil {
		return nil, nil, err
	}
	if unpublish, err = resolve("Unpublish"); err != nil {
		return nil, nil, err
	}
	return publish, unpublish, nil
}
