package fakecsiproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	fsv1 "github.com/kubernetes-csi/csi-proxy/client/api/filesystem/v1"
	"google.golang.org/grpc"
)

// Method names as they appear in Call.Method.
const (
	PathExists    = "PathExists"
	Mkdir         = "Mkdir"
	Rmdir         = "Rmdir"
	CreateSymlink = "CreateSymlink"
	IsSymlink     = "IsSymlink"
)

// MaxPath is csi-proxy v1's limit on a path's length (utils.MaxPathLengthWindows).
const MaxPath = 260

// Call is one request the fake received.
type Call struct {
	Method string
	// Path is the request's path (CreateSymlink: target_path, the link).
	Path string
	// Source is CreateSymlink's source_path (the existing directory).
	Source string
	// Force is Rmdir's force.
	Force bool
}

func (c Call) String() string {
	switch c.Method {
	case CreateSymlink:
		return fmt.Sprintf("%s %s -> %s", c.Method, c.Path, c.Source)
	case Rmdir:
		if c.Force {
			return fmt.Sprintf("%s %s force", c.Method, c.Path)
		}
	}
	return c.Method + " " + c.Path
}

// Server is the fake. Create it with Start.
type Server struct {
	fsv1.UnimplementedFilesystemServer

	workingDirs []string
	sock        string
	srv         *grpc.Server

	mu    sync.Mutex
	calls []Call
	fail  func(Call) error
}

// Start serves the fake on a unix socket in a new temporary directory until
// the test ends. workingDirs are csi-proxy's working directories (its
// --kubelet-path and --working-dir): at least one.
func Start(t testing.TB, workingDirs ...string) *Server {
	t.Helper()
	if len(workingDirs) == 0 {
		t.Fatal("fakecsiproxy.Start: no working directory")
	}
	// A short directory: a unix socket's path has at most 107 bytes.
	dir, err := os.MkdirTemp("", "csiproxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{workingDirs: workingDirs, sock: filepath.Join(dir, "filesystem-v1.sock"), srv: grpc.NewServer()}
	l, err := net.Listen("unix", s.sock)
	if err != nil {
		t.Fatal(err)
	}
	fsv1.RegisterFilesystemServer(s.srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.srv.Serve(l)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return s
}

// Dial connects to the fake, whatever the pipe's name (see
// mount.CSIProxyOptions.Dial).
func (s *Server) Dial(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", s.sock)
}

// Stop stops serving and closes every connection: csi-proxy is down.
func (s *Server) Stop() { s.srv.Stop() }

// Calls returns the calls received so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Reset forgets the calls received so far.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = nil
}

// Fail makes every later call for which f returns an error fail with it,
// before it does anything (nil: no more failures). The call is recorded
// either way.
func (s *Server) Fail(f func(Call) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = f
}

func (s *Server) record(c Call) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
	if s.fail != nil {
		return s.fail(c)
	}
	return nil
}

// validate is csi-proxy v1.3.0's validatePathWindows on the host's paths.
func (s *Server) validate(path string) error {
	if len(path) > MaxPath {
		return fmt.Errorf("path length %d exceeds maximum characters: %d", len(path), MaxPath)
	}
	if strings.Contains(path, "..") {
		return fmt.Errorf("path contains invalid characters: %s", path)
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("not an absolute Windows path: %s", path)
	}
	for _, w := range s.workingDirs {
		if strings.HasPrefix(strings.ToLower(path), strings.ToLower(w)) {
			return nil
		}
	}
	return fmt.Errorf("path: %s is not within the working directories: %v", path, s.workingDirs)
}

func (s *Server) PathExists(_ context.Context, r *fsv1.PathExistsRequest) (*fsv1.PathExistsResponse, error) {
	if err := s.record(Call{Method: PathExists, Path: r.GetPath()}); err != nil {
		return nil, err
	}
	if err := s.validate(r.GetPath()); err != nil {
		return nil, err
	}
	_, err := os.Lstat(r.GetPath())
	switch {
	case err == nil:
		return &fsv1.PathExistsResponse{Exists: true}, nil
	case errors.Is(err, os.ErrNotExist):
		return &fsv1.PathExistsResponse{}, nil
	}
	return nil, err
}

func (s *Server) Mkdir(_ context.Context, r *fsv1.MkdirRequest) (*fsv1.MkdirResponse, error) {
	if err := s.record(Call{Method: Mkdir, Path: r.GetPath()}); err != nil {
		return nil, err
	}
	if err := s.validate(r.GetPath()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.GetPath(), 0o755); err != nil {
		return nil, err
	}
	return &fsv1.MkdirResponse{}, nil
}

func (s *Server) Rmdir(_ context.Context, r *fsv1.RmdirRequest) (*fsv1.RmdirResponse, error) {
	if err := s.record(Call{Method: Rmdir, Path: r.GetPath(), Force: r.GetForce()}); err != nil {
		return nil, err
	}
	if err := s.validate(r.GetPath()); err != nil {
		return nil, err
	}
	rm := os.Remove
	if r.GetForce() {
		rm = os.RemoveAll
	}
	if err := rm(r.GetPath()); err != nil {
		return nil, err
	}
	return &fsv1.RmdirResponse{}, nil
}

func (s *Server) CreateSymlink(_ context.Context, r *fsv1.CreateSymlinkRequest) (*fsv1.CreateSymlinkResponse, error) {
	if err := s.record(Call{Method: CreateSymlink, Path: r.GetTargetPath(), Source: r.GetSourcePath()}); err != nil {
		return nil, err
	}
	if err := s.validate(r.GetTargetPath()); err != nil {
		return nil, err
	}
	if err := s.validate(r.GetSourcePath()); err != nil {
		return nil, err
	}
	if err := os.Symlink(r.GetSourcePath(), r.GetTargetPath()); err != nil {
		return nil, err
	}
	return &fsv1.CreateSymlinkResponse{}, nil
}

func (s *Server) IsSymlink(_ context.Context, r *fsv1.IsSymlinkRequest) (*fsv1.IsSymlinkResponse, error) {
	if err := s.record(Call{Method: IsSymlink, Path: r.GetPath()}); err != nil {
		return nil, err
	}
	fi, err := os.Lstat(r.GetPath())
	if err != nil {
		return nil, err
	}
	if fi.Mode()&(os.ModeSymlink|os.ModeIrregular) == 0 {
		return &fsv1.IsSymlinkResponse{}, nil
	}
	dest, err := os.Readlink(r.GetPath())
	if err != nil {
		return nil, fmt.Errorf("readlink error: %v", err)
	}
	_, err = os.Lstat(dest)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return &fsv1.IsSymlinkResponse{IsSymlink: err == nil}, nil
}
