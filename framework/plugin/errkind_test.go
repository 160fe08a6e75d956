package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// failing is a backend whose Create fails with err.
func failing(err error) framework.Backend {
	return framework.BackendFuncs{CreateFunc: func(context.Context, *api.Volume) (api.Source, error) {
		return api.Source{}, err
	}}
}

// publishCode publishes one volume of backend b on a driver with a fake
// mounter (no root needed) and returns the publish's code and message.
func publishCode(t *testing.T, b framework.Backend) (codes.Code, string) {
	t.Helper()
	h := drivertest.Start(t, framework.Options{Backends: map[string]framework.Backend{"p": b}, Volumes: framework.VolumeOptions{Mounter: mount.NewFake()}})
	k, ctx := h.Kubelet, t.Context()
	err := k.Publish(ctx, k.NewPod("ns", "pod"), drivertest.InlineVolume{Name: "v"})
	if err == nil {
		t.Fatal("publish succeeded; the backend fails every Create")
	}
	st := status.Convert(err)
	return st.Code(), st.Message()
}

// Every kind of the module's error table, and a backend's own gRPC status,
// gives the same code in process (the backend in the driver) and through a
// plugin (the same backend behind a pluginserver on a unix socket): the kind
// crosses the socket and comes back as the same sentinel.
func TestErrorKindsSameCodeThroughPlugin(t *testing.T) {
	type tc struct {
		name string
		err  error
		code codes.Code
	}
	var cases []tc
	for _, k := range errkind.Kinds {
		cases = append(cases, tc{k.Reason, fmt.Errorf("backend: creating storage: %w", k.Err), k.Code})
	}
	cases = append(cases,
		tc{"ENOSPC in a PathError", &fs.PathError{Op: "write", Path: "/var/lib/b/x", Err: syscall.ENOSPC}, codes.ResourceExhausted},
		tc{"EBUSY in a PathError", &fs.PathError{Op: "rmdir", Path: "/var/lib/b/x", Err: syscall.EBUSY}, codes.Aborted},
		tc{"ENOENT", &fs.PathError{Op: "open", Path: "/var/lib/b/x", Err: syscall.ENOENT}, codes.Unavailable},
		// The first kind of the table that matches decides.
		tc{"joined", errors.Join(api.ErrNotFound, syscall.EBUSY), codes.Aborted},
		tc{"backend status", status.Error(codes.FailedPrecondition, "the backend's own words"), codes.FailedPrecondition},
		tc{"wrapped backend status", fmt.Errorf("b: %w", status.Error(codes.OutOfRange, "too far")), codes.OutOfRange},
		tc{"no kind", errors.New("boom"), codes.Internal},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inProcess, _ := publishCode(t, failing(c.err))
			ep := serveInProcess(t, pluginserver.Options{Backend: failing(c.err)})
			viaPlugin, msg := publishCode(t, newClient(t, plugin.Options{Name: "p", Endpoint: ep}))
			if inProcess != c.code || viaPlugin != c.code {
				t.Errorf("in process %s, through a plugin %s (%q); want %s both", inProcess, viaPlugin, msg, c.code)
			}
			if !strings.Contains(msg, "plugin p") {
				t.Errorf("through a plugin: message %q does not name the plugin", msg)
			}
		})
	}
}

// bareStatusPlugin is a Go plugin of its own (not pluginserver) that answers
// Create with a status and no kind, as older plugins and plugins in other
// languages do.
type bareStatusPlugin struct {
	pb.UnimplementedPluginServer
	st *status.Status
}

func (p bareStatusPlugin) Handshake(context.Context, *pb.HandshakeRequest) (*pb.HandshakeResponse, error) {
	return &pb.HandshakeResponse{Name: "bare", Version: "1", ProtocolVersion: plugin.ProtocolVersion,
		Capabilities: []pb.Capability{pb.Capability_CAPABILITY_CREATE}}, nil
}

func (p bareStatusPlugin) Create(context.Context, *pb.CreateRequest) (*pb.CreateResponse, error) {
	return nil, p.st.Err()
}

// Delete answers the rollback of the failed publish.
func (p bareStatusPlugin) Delete(context.Context, *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	return &pb.DeleteResponse{}, nil
}

// serveBare serves a bareStatusPlugin answering st until the test ends.
func serveBare(t *testing.T, st *status.Status) string {
	t.Helper()
	p := filepath.Join(sockDir(t), "bare.sock")
	ln, err := unixsock.Listen(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterPluginServer(g, bareStatusPlugin{st: st})
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(listener{ln}) }()
	t.Cleanup(func() { g.Stop(); <-done; _, _ = ln.Unlink() })
	return "unix://" + p
}

// listener adapts unixsock's listener to net.Listener.
type listener struct{ *unixsock.Listener }

func withInfo(t *testing.T, st *status.Status, domain, reason string) *status.Status {
	t.Helper()
	s, err := st.WithDetails(&errdetails.ErrorInfo{Domain: domain, Reason: reason})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// An answer without a kind, or with one this driver does not know (a newer
// plugin's reason, another domain's), keeps the mapping by code: the protocol
// change is backward compatible.
func TestBareStatusKeepsCodeMapping(t *testing.T) {
	for _, c := range []struct {
		name string
		st   *status.Status
		code codes.Code
	}{
		{"aborted", status.New(codes.Aborted, "busy elsewhere"), codes.Aborted},
		{"resource exhausted", status.New(codes.ResourceExhausted, "disk full"), codes.ResourceExhausted},
		{"invalid", status.New(codes.InvalidArgument, "bad colour"), codes.InvalidArgument},
		{"internal", status.New(codes.Internal, "boom"), codes.Internal},
		// A plugin that refuses a call it offered was replaced: transient.
		{"failed precondition", status.New(codes.FailedPrecondition, "not now"), codes.Unavailable},
		{"unimplemented", status.New(codes.Unimplemented, "no"), codes.Unavailable},
		{"deadline", status.New(codes.DeadlineExceeded, "slow"), codes.Unavailable},
		{"unknown reason", withInfo(t, status.New(codes.FailedPrecondition, "newer"), errkind.Domain, "SOMETHING_NEWER"), codes.Unavailable},
		{"other domain", withInfo(t, status.New(codes.FailedPrecondition, "theirs"), "example.com", "EBUSY"), codes.Unavailable},
		// The same status with a kind: the backend's own code passes.
		{"kind status", withInfo(t, status.New(codes.FailedPrecondition, "mine"), errkind.Domain, errkind.ReasonStatus), codes.FailedPrecondition},
		{"kind EBUSY", withInfo(t, status.New(codes.Internal, "older code"), errkind.Domain, "EBUSY"), codes.Aborted},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep := serveBare(t, c.st)
			got, msg := publishCode(t, newClient(t, plugin.Options{Name: "p", Endpoint: ep}))
			if got != c.code {
				t.Errorf("code %s (%q), want %s", got, msg, c.code)
			}
			if !strings.Contains(msg, c.st.Message()) || !strings.Contains(msg, "plugin p") {
				t.Errorf("message %q lacks the plugin's %q or its name", msg, c.st.Message())
			}
		})
	}
}
