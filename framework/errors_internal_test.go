package framework

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// Codes are chosen in one table: no file of the framework's packages but
// internal/errkind's builds a gRPC status (status.Error, Errorf, New, Newf, or a
// status.Status literal).
func TestCodesChosenInOnePlace(t *testing.T) {
	var pkgs []string
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), "_")) {
			return filepath.SkipDir
		}
		if d.IsDir() {
			pkgs = append(pkgs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, dir := range pkgs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			name := filepath.Join(dir, e.Name())
			// The table is errkind's: the framework's servers and pluginserver
			// (the plugin protocol, api/plugin/v1alpha1) answer by it.
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") ||
				dir == filepath.Join("internal", "errkind") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			alias := ""
			for _, imp := range f.Imports {
				if imp.Path.Value == `"google.golang.org/grpc/status"` {
					alias = "status"
					if imp.Name != nil {
						alias = imp.Name.Name
					}
				}
			}
			if alias == "" {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == alias {
					switch sel.Sel.Name {
					case "Error", "Errorf", "New", "Newf", "FromProto", "ErrorProto":
						t.Errorf("%s: status.%s outside framework/internal/errkind: return an api sentinel or a kind instead (framework/internal/errkind)", fset.Position(sel.Pos()), sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
}

func TestToStatus(t *testing.T) {
	backendStatus := status.Error(codes.FailedPrecondition, "the backend's own words")
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"invalid", errkind.Invalidf("volume_id is required"), codes.InvalidArgument, "volume_id is required"},
		{"sentinel", fmt.Errorf("sizing: %w", api.ErrResourceExhausted), codes.ResourceExhausted, "sizing: resource exhausted"},
		{"transient keeps its cause", errkind.Transient(fmt.Errorf("reading state: %w", api.ErrNotFound)), codes.Unavailable, "reading state: not found"},
		{"outer kind wins", errkind.Transient(fmt.Errorf("repair: %w", backendStatus)), codes.Unavailable, "repair: the backend's own words"},
		{"backend status passes", backendStatus, codes.FailedPrecondition, "the backend's own words"},
		{"wrapped backend status", fmt.Errorf("backend b: creating storage: %w", backendStatus), codes.FailedPrecondition, "backend b: creating storage: the backend's own words"},
		{"joined", fmt.Errorf("publish failed: %w; rollback incomplete: %w", backendStatus, syscall.EBUSY), codes.FailedPrecondition, "publish failed: the backend's own words; rollback incomplete: device or resource busy"},
		{"symlink", fmt.Errorf("x: %w", mount.ErrSymlink), codes.InvalidArgument, "x: path contains a symbolic link"},
		{"target moved", fmt.Errorf("x: %w", mount.ErrTargetMoved), codes.Aborted, ""},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded, ""},
		{"unknown", errors.New("boom"), codes.Internal, "boom"},
		{"not supported", fmt.Errorf("tmpfs: %w", api.ErrNotSupported), codes.InvalidArgument, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := status.Convert(errkind.Status(tc.err))
			if s.Code() != tc.code {
				t.Errorf("code %s, want %s", s.Code(), tc.code)
			}
			if tc.msg != "" && s.Message() != tc.msg {
				t.Errorf("message %q, want %q", s.Message(), tc.msg)
			}
			if strings.Contains(s.Message(), "rpc error") {
				t.Errorf("nested status in %q", s.Message())
			}
		})
	}
	// transient keeps the cause for errors.Is.
	if !errors.Is(errkind.Transient(fmt.Errorf("x: %w", syscall.EBUSY)), syscall.EBUSY) {
		t.Error("transient lost its cause")
	}
}
