// Package guide checks that the Go identifiers the documentation names exist:
// every `pkg.Name`, `pkg.Type.Member` and `Type.Member` code span of
// docs/authors.md, README.md and docs/design.md (and the qualified names in
// their Go blocks) is looked up in the source of the SDK's packages, and every
// repository path they name exists.
package guide

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// decls are one package's exported names: top-level declarations, and the
// fields and methods (interface methods included) of each type.
type decls struct {
	top     map[string]bool
	members map[string]map[string]bool
	// fieldTypes maps a struct field's name to the names of the types it has
	// in any struct of the package (Options.Node is a NodeOptions), so that a
	// field path such as `Node.ID` resolves through the grouped Options.
	fieldTypes map[string][]string
}

func newDecls() *decls {
	return &decls{top: map[string]bool{}, members: map[string]map[string]bool{}, fieldTypes: map[string][]string{}}
}

func (d *decls) member(typ, name string) {
	if d.members[typ] == nil {
		d.members[typ] = map[string]bool{}
	}
	d.members[typ][name] = true
}

// load parses every non-test Go file (all platforms) below the SDK's
// directories, keyed by package name.
func load(t *testing.T, root string) map[string][]*decls {
	t.Helper()
	pkgs := map[string][]*decls{}
	byDir := map[string]*decls{}
	fset := token.NewFileSet()
	for _, top := range []string{"api", "framework", "drivers"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() && e.Name() == "testdata" {
				return filepath.SkipDir
			}
			if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			dir := filepath.Dir(path)
			d := byDir[dir]
			if d == nil {
				d = newDecls()
				byDir[dir] = d
				pkgs[f.Name.Name] = append(pkgs[f.Name.Name], d)
			}
			collect(d, f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return pkgs
}

func collect(d *decls, f *ast.File) {
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			if decl.Recv == nil {
				d.top[decl.Name.Name] = true
				continue
			}
			typ := decl.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if ix, ok := typ.(*ast.IndexExpr); ok {
				typ = ix.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				d.member(id.Name, decl.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						d.top[n.Name] = true
					}
				case *ast.TypeSpec:
					d.top[spec.Name.Name] = true
					var fields *ast.FieldList
					switch typ := spec.Type.(type) {
					case *ast.StructType:
						fields = typ.Fields
					case *ast.InterfaceType:
						fields = typ.Methods
					}
					if fields == nil {
						continue
					}
					for _, fld := range fields.List {
						for _, n := range fld.Names {
							d.member(spec.Name.Name, n.Name)
							if id, ok := fld.Type.(*ast.Ident); ok {
								d.fieldTypes[n.Name] = append(d.fieldTypes[n.Name], id.Name)
							}
						}
						if len(fld.Names) == 0 { // embedded: its name
							typ := fld.Type
							if s, ok := typ.(*ast.StarExpr); ok {
								typ = s.X
							}
							switch typ := typ.(type) {
							case *ast.Ident:
								d.member(spec.Name.Name, typ.Name)
							case *ast.SelectorExpr:
								d.member(spec.Name.Name, typ.Sel.Name)
							}
						}
					}
				}
			}
		}
	}
}

var (
	codeSpan  = regexp.MustCompile("`([^`\n]+)`")
	goBlock   = regexp.MustCompile("(?s)```go\n(.*?)```")
	qualified = regexp.MustCompile(`\b(api|framework|drivertest|backendtest|tmpfs|events|kube|failpoint|stamp|boltstore|memstore)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
	dotted    = regexp.MustCompile(`^([A-Za-z]\w*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?$`)
	repoPath  = regexp.MustCompile(`^(api|framework|drivers|examples|deploy|test|docs)/[\w./-]*$`)
)

// resolve reports whether a.b[.c] names something: a package's declaration
// (and a member of it), or a member of an exported type of some package.
// Names whose first part is neither (a variable such as v.Params) are not
// checked.
func resolve(pkgs map[string][]*decls, a, b, c string) (checked, ok bool) {
	if ds, isPkg := pkgs[a]; isPkg {
		for _, d := range ds {
			if d.top[b] && (c == "" || d.members[b][c]) {
				return true, true
			}
		}
		return true, false
	}
	if a == "" || a[0] < 'A' || a[0] > 'Z' {
		return false, false
	}
	found := false
	for _, ds := range pkgs {
		for _, d := range ds {
			if d.top[a] {
				found = true
				if d.members[a][b] && (c == "" || hasMemberAnywhere(pkgs, c)) {
					return true, true
				}
			}
			// A field path: a is a field of some struct, b a member of its type.
			for _, typ := range d.fieldTypes[a] {
				found = true
				if d.members[typ][b] && (c == "" || hasMemberAnywhere(pkgs, c)) {
					return true, true
				}
			}
		}
	}
	return found, false
}

func hasMemberAnywhere(pkgs map[string][]*decls, name string) bool {
	for _, ds := range pkgs {
		for _, d := range ds {
			for _, m := range d.members {
				if m[name] {
					return true
				}
			}
		}
	}
	return false
}

func TestDocsNamesExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := load(t, root)
	for _, doc := range []string{"docs/authors.md", "README.md", "docs/design.md"} {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		checked := 0
		check := func(span, a, b, c string) {
			isChecked, ok := resolve(pkgs, a, b, c)
			if !isChecked {
				return
			}
			checked++
			if !ok {
				t.Errorf("%s names %q, which the code does not declare (go doc %s)", doc, span, strings.TrimSuffix(a+"."+b+"."+c, "."))
			}
		}
		blocks := goBlock.FindAllStringSubmatch(text, -1)
		for _, blk := range blocks {
			for _, m := range qualified.FindAllStringSubmatch(blk[1], -1) {
				check(m[0], m[1], m[2], m[3])
			}
		}
		prose := goBlock.ReplaceAllString(text, "")
		for _, m := range codeSpan.FindAllStringSubmatch(prose, -1) {
			span := m[1]
			if repoPath.MatchString(span) {
				checked++
				if _, err := os.Stat(filepath.Join(root, strings.TrimSuffix(span, "/"))); err != nil {
					t.Errorf("%s names the path %q, which does not exist", doc, span)
				}
				continue
			}
			name := span
			if i := strings.IndexByte(name, '('); i > 0 {
				name = name[:i] // framework.New(Options) -> framework.New
			}
			name = strings.TrimPrefix(name, "*")
			if d := dotted.FindStringSubmatch(name); d != nil {
				check(span, d[1], d[2], d[3])
			}
		}
		// A checker that resolves nothing proves nothing.
		if checked < 20 {
			t.Errorf("%s: only %d names checked; the patterns no longer match the guide", doc, checked)
		}
		t.Logf("%s: %d names checked", doc, checked)
	}
}
