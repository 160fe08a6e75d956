package framework_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPackageDocs: every package of the module (the placed ones of layers)
// has its package comment in doc.go and nowhere else, and the comment names
// at least one of the package's exported types when it has any: the reader of
// a package starts at its core types.
func TestPackageDocs(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := []string{"drivers/scratch/cmd/kubectl-ephemera", "drivers/scratch"}
	for p := range layers {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	for _, pkg := range pkgs {
		dir := filepath.Join(root, pkg)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Errorf("%s: %v", pkg, err)
			continue
		}
		fset := token.NewFileSet()
		var doc string
		var types []string
		for _, e := range entries {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if f.Doc != nil {
				if name != "doc.go" {
					t.Errorf("%s/%s has a package comment: it belongs in doc.go", pkg, name)
				} else {
					doc = f.Doc.Text()
				}
			}
			for _, d := range f.Decls {
				if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
					for _, s := range g.Specs {
						if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
							types = append(types, ts.Name.Name)
						}
					}
				}
			}
		}
		switch {
		case doc == "":
			t.Errorf("%s: no package comment in doc.go", pkg)
		case len(types) > 0 && !slices.ContainsFunc(types, func(ty string) bool {
			return regexp.MustCompile(`\b` + ty + `\b`).MatchString(doc)
		}):
			t.Errorf("%s: doc.go names none of the package's types (%s): name its core types", pkg, strings.Join(types, ", "))
		}
	}
}
