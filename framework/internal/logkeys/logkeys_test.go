package logkeys_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// repoRoot finds the module root above this package.
func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found")
		}
		dir = parent
	}
}

// notLoggers are packages and receivers with Info or Error methods that do not
// log (http.Error, status.Error, testing's t.Error).
var notLoggers = map[string]bool{"http": true, "status": true, "t": true, "tb": true, "b": true}

// keyArgs returns the key arguments of a structured logging call: for
// Info(msg, k, v, ...) and InfoS, args 1, 3, ...; for Error(err, msg, k, v,
// ...) and ErrorS, 2, 4, ...; for WithValues(k, v, ...), 0, 2, ....
func keyArgs(call *ast.CallExpr) []ast.Expr {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	if x, ok := sel.X.(*ast.Ident); ok && notLoggers[x.Name] {
		return nil
	}
	first := -1
	switch sel.Sel.Name {
	case "Info", "InfoS":
		first = 1
	case "Error", "ErrorS":
		first = 2
	case "WithValues":
		first = 0
	}
	if first < 0 {
		return nil
	}
	var keys []ast.Expr
	for i := first; i < len(call.Args); i += 2 {
		keys = append(keys, call.Args[i])
	}
	return keys
}

// Every key of every structured logging call in the module's code (tests
// aside) is a constant of this package: one list of keys, spelled one way.
func TestEveryLogKeyComesFromLogkeys(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	for _, top := range []string{"api", "framework", "drivers"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, p, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				for _, k := range keyArgs(call) {
					if !isLogkey(k) {
						t.Errorf("%s: log key %s is not a logkeys constant", fset.Position(k.Pos()), exprString(k))
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func isLogkey(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "logkeys"
}

func exprString(e ast.Expr) string {
	if lit, ok := e.(*ast.BasicLit); ok {
		return lit.Value
	}
	return reflect.TypeOf(e).String()
}

// The keys follow the Kubernetes structured logging guide: lowerCamelCase.
func TestKeysAreLowerCamelCase(t *testing.T) {
	src, err := os.ReadFile("logkeys.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "logkeys.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	camel := regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)
	seen := map[string]string{}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		vs, ok := node.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			lit, ok := vs.Values[i].(*ast.BasicLit)
			if !ok {
				t.Errorf("%s is not a string literal", name.Name)
				continue
			}
			v, _ := strconv.Unquote(lit.Value)
			if !camel.MatchString(v) {
				t.Errorf("%s = %q is not lowerCamelCase", name.Name, v)
			}
			if other, dup := seen[v]; dup {
				t.Errorf("%s and %s are both %q", name.Name, other, v)
			}
			seen[v] = name.Name
			n++
		}
		return true
	})
	if n == 0 {
		t.Fatal("no keys found")
	}
}
